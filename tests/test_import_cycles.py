"""The project's imports form no cycle: between packages, between subpackages, between
modules (imports inside functions count too; ``if TYPE_CHECKING:`` blocks do not run
and do not count).

The layers: ``harness`` (the engine, CLI, studies) imports ``kernels``, ``reports`` and
``allocators``; those import from ``harness`` only its shared modules (``SHARED``), which
import nothing else of the project. A cycle found here is named module by module.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder -> import name (pyproject.toml's package-dir)
PACKAGES = {"harness": "harness", "allocators": "pagebench.allocators",
            "kernels": "pagebench.kernels", "reports": "pagebench.reports"}
# Importable by every package without importing the harness's engine: errors, file I/O,
# the results format, worker-process helpers (and harness/__init__: the version string).
SHARED = ("harness", "harness.errors", "harness.fileio", "harness.run.results", "harness.run.processes",
          "harness.run.run_lock")


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imported_names(tree: ast.AST, package: str) -> list[str]:
    """Dotted names a module imports (``from a import b`` gives ``a`` and ``a.b``)."""
    names, todo = [], [tree]
    while todo:
        node = todo.pop()
        if _is_type_checking(node):
            todo += node.orelse
            continue
        todo += ast.iter_child_nodes(node)
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing module's package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def _module_graph() -> dict[str, set[str]]:
    """Each project module and the project modules it imports."""
    files = {}
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = (name, *path.relative_to(ROOT / folder).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for name in _imported_names(ast.parse(path.read_text(), str(path)), package):
            while name and name not in files:  # ``a.b.func`` -> module ``a.b``
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


GRAPH = _module_graph()


def _grouped(group) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        graph.setdefault(group(module), set()).update(
            group(t) for t in targets if group(t) != group(module))
    return graph


def _assert_acyclic(graph: dict[str, set[str]], what: str) -> None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle between {what}: {' -> '.join(exc.args[1])}") from None


def _package(module: str) -> str:
    if module in SHARED:
        return "harness (shared)"
    return ".".join(module.split(".")[:2]) if module.startswith("pagebench.") else module.split(".")[0]


def test_the_graph_sees_the_known_imports():
    """(The walk works: a few imports the code is known to make are found.)"""
    assert "harness.errors" in GRAPH["pagebench.kernels.bench_spec"]
    assert "pagebench.reports.render" in GRAPH["harness.run.serve"]
    assert "pagebench.allocators.base" in GRAPH["harness.engine.scheduler"]
    assert "harness.studies.runner" in GRAPH["harness.studies.paper"]


def test_no_cycle_between_modules():
    _assert_acyclic(GRAPH, "modules")


def test_no_cycle_between_subpackages():
    _assert_acyclic(_grouped(lambda m: ".".join(m.split(".")[:2])), "subpackages")


def test_no_cycle_between_packages():
    _assert_acyclic(_grouped(_package), "packages (harness's shared modules apart)")


@pytest.mark.parametrize("module", SHARED)
def test_shared_modules_import_only_shared_modules(module):
    """kernels/ and reports/ may import these without pulling in the harness's engine."""
    assert GRAPH[module] <= set(SHARED), (
        f"{module} imports {sorted(GRAPH[module] - set(SHARED))}: a shared module may import "
        f"only {SHARED}")
