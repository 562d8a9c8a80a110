"""The README's install line says how to get PyTorch's CPU build, as the example workflow does."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_gives_the_workflows_cpu_wheel_index_for_the_same_torch():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    workflow = (ROOT / ".github" / "workflows" / "pagebench-gate.yml").read_text(encoding="utf-8")
    installs = re.findall(r"pip install (torch==[\d.]+) --index-url (\S+)", workflow)
    assert installs, "the workflow installs torch from an index"
    setup = re.search(r"pip install (torch==[\d.]+) -e \.", readme).group(1)  # set-up command 1
    for torch, index in installs:
        assert torch == setup
        assert f"pip install {torch} --index-url {index}" in readme
