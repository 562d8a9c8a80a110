"""The project's docs stand alone: no reference to a design guide outside the repository,
and every ``docs/*.md`` the README or the code names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("allocators", "baselines", "benchmarks", "conf", "docs", "harness", "kernels",
           "reports", "scripts", "tests")


def project_texts() -> dict[Path, str]:
    files = [ROOT / "README.md"] + [path for top in SOURCES for path in (ROOT / top).rglob("*")
                                    if path.suffix in (".py", ".md", ".yaml", ".sh")]
    return {path: path.read_text(encoding="utf-8") for path in files if path.is_file()}


def test_nothing_refers_to_a_guide_outside_the_repository():
    this = Path(__file__).resolve()
    hits = [f"{path.relative_to(ROOT)}:{text.count('GUIDE')}" for path, text in
            project_texts().items() if path.resolve() != this and re.search(r"\bGUIDE\b", text)]
    assert hits == []


def test_every_docs_page_named_exists():
    # a docs/ page of this repository, not a path inside another one's URL (".../docs/x.md")
    named = {match for text in project_texts().values()
             for match in re.findall(r"(?<![/\w])docs/[\w.-]+\.md", text)}
    assert "docs/memory.md" in named
    assert sorted(name for name in named if not (ROOT / name).is_file()) == []


def test_the_memory_page_defines_every_step_category():
    from harness.metrics.summaries import MEMORY_CATEGORIES

    page = (ROOT / "docs" / "memory.md").read_text(encoding="utf-8")
    assert [c for c in MEMORY_CATEGORIES if f"`{c}`" not in page] == []
    assert "Idle vs external fragmentation" in page
