"""Every third-party module the package imports is installed with it (pyproject's
``dependencies``, directly or through one of them): a module that is only there by
chance on a developer's machine fails on a fresh one."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "allocators", "kernels", "reports")
# Imported only where absent is handled: the tokenizer option says to install it, and the
# other is for type checkers only.
OPTIONAL = {"transformers", "typing_extensions"}


def _name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _installed_with(distribution: str) -> set[str]:
    """The distribution and, recursively, what it requires (extras left out)."""
    seen: set[str] = set()
    todo = [distribution]
    while todo:
        name = _name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [r for r in requires if "extra ==" not in r]
    return seen


def _imported_modules() -> set[str]:
    modules = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - set(PACKAGES) - OPTIONAL


def test_every_imported_module_is_a_declared_dependency():
    try:
        installed = _installed_with("pagebench")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        pytest.skip("pagebench is not installed (pip install -e .)")
    providers = metadata.packages_distributions()
    missing = {}
    for module in sorted(_imported_modules()):
        names = {_name(d) for d in providers.get(module, [module])}
        if not names & installed:
            missing[module] = sorted(names)
    assert not missing, (f"imported but not installed with pagebench: {missing}; declare them in "
                         "pyproject.toml (and pip install -e . again)")
