"""The project's imports go down floors and form no cycle: between packages, between
subpackages, between modules (imports inside functions count too; ``if TYPE_CHECKING:``
blocks do not run and do not count).

The floors (``FLOORS``, lowest first): harness's shared modules (errors, file I/O, worker
processes, the results format, the spec schema), then the libraries (``pagebench.allocators``,
``kernels``, ``reports``: they import from ``harness`` only its shared modules), then
harness's rooms, each importing only from its own floor and those below: what a model is,
what a workload is, the config that checks them, the metrics, the engine, one run, and the
commands built on runs. A cycle or an import up a floor is named module by module.
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
# the results format, worker-process helpers, the typed-spec schema (and harness/__init__:
# the version string).
SHARED = ("harness", "harness.errors", "harness.fileio", "harness.results_format",
          "harness.processes", "harness.spec_schema")
# Lowest first; a module may import from its own floor and the floors below it. The top
# floor is the commands' entry points (``python -m harness``, the old tool paths).
FLOORS = (
    "shared",  # SHARED
    "pagebench.allocators",  # KV managers: pure Python
    "pagebench.kernels",  # Triton kernels and their benchmark
    "pagebench.reports",  # report.html from a run directory
    "harness.models",  # a model's dimensions, layer groups, Hugging Face config readers
    "harness.workloads",  # requests: generated, replayed, their specs
    "harness.config",  # composition checks and the typed specs of a run
    "harness.metrics",  # step and request records, summaries
    "harness.engine",  # scheduler, executors, cost models
    "harness.run",  # one serving run: its plan, workers, results, lock
    "harness.gate",  # the regression gate over result files
    "harness.tools",  # calibrate, hostcost, traces
    "harness.studies",  # studies of many runs
    "entry points",  # harness.__main__ and the forwarding modules of old tool paths
)


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


def _floor(module: str) -> str:
    """The floor of ``module`` (one of ``FLOORS``)."""
    if module in SHARED:
        return "shared"
    room = ".".join(module.split(".")[:2])
    return room if room in FLOORS else "entry points"


def test_every_room_has_a_floor():
    rooms = {".".join(m.split(".")[:2]) for m in GRAPH if m not in SHARED}
    top_level = {m for m in rooms if _floor(m) == "entry points"}
    assert top_level == {"harness.__main__", "harness.calibrate", "harness.hostcost",
                         "harness.traces"}, top_level


def test_no_import_goes_up_a_floor():
    level = {floor: i for i, floor in enumerate(FLOORS)}
    upward = sorted(f"{m} ({_floor(m)}) imports {t} ({_floor(t)})" for m, targets in GRAPH.items()
                    for t in targets if level[_floor(t)] > level[_floor(m)])
    assert not upward, "imports up a floor:\n" + "\n".join(upward)


def test_at_most_twelve_rooms():
    """harness/'s top level: at most 12 folders (rooms); shared modules and entry points
    beside them."""
    rooms = [p.name for p in (ROOT / "harness").iterdir()
             if p.is_dir() and (p / "__init__.py").exists()]
    assert len(rooms) <= 12, rooms


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
