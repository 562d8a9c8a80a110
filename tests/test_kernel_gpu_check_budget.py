"""scripts/gpu_common.sh: stage limits are shares of the budget, no stage outlasts its limit,
and the outputs come back as at most 8 files with no folders (the device tool's limits)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent

SCRIPT = r"""
set -uo pipefail
NAME="$1" OUT_DIR="$2" BUDGET_S=100
source scripts/gpu_common.sh
stage quick 20 0 true                   # 20% of 100 s
stage slow 10 0 sleep 30                # cut at its 10 s limit: SIGINT at 8 s
stage squeezed 30 95 true               # the 95% reserve leaves < 10 s: skipped
for i in 1 2 3 4 5 6 7 8 9; do echo "$i" > "$WORK/summary$i.md"; done
mkdir -p "$WORK/deep/er" && echo x > "$WORK/deep/er/file.txt"
pack_outputs summary1.md summary2.md summary3.md summary4.md summary5.md summary6.md summary7.md summary8.md
cat "$STAGES"
"""


def test_stage_budget_shares_limits_and_the_eight_file_pack(tmp_path):
    name = f"pytest-{os.getpid()}"
    out = tmp_path / "out"
    try:
        proc = subprocess.run(["bash", "-c", SCRIPT, "bash", name, str(out)], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
    finally:
        subprocess.run(["rm", "-rf", str(REPO / "build" / "gpu_work" / name)])
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines() if line.count("\t") == 3]
    stages = {r[0]: r[1:] for r in rows}
    assert stages["quick"][:2] == ["0", "20"]
    rc, limit, took = stages["slow"]
    assert rc == "124" and limit == "10" and int(took) <= 10  # SIGINT ended it inside its limit
    assert stages["squeezed"][0] == "skipped (time budget)"
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 8 and all((out / f).is_file() for f in files)  # the archive + 7 summaries
    assert f"{name}.tar.gz" in files and "summary8.md" not in files
    listing = subprocess.run(["tar", "tzf", str(out / f"{name}.tar.gz")], capture_output=True, text=True).stdout
    assert "./deep/er/file.txt" in listing and "./summary8.md" in listing  # nothing is lost: it is archived
