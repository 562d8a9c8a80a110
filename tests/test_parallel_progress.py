"""Progress of systems simulated in worker processes: the parent draws a bar per system
from what the workers publish (harness.run.progress)."""

from __future__ import annotations

import multiprocessing
import re

from harness.run.progress import ParallelBars, publish, shared_progress
from test_run_parallel import run_in_process


def test_bars_follow_what_the_workers_publish(capsys):
    slots = shared_progress(multiprocessing.get_context("fork"), 2)
    bars = ParallelBars(["paged", "max"], 10, slots)
    publish(slots, 1, 7, 42.0)
    bars.refresh()
    assert [bar.n for bar in bars.bars] == [0, 7]
    bars.close()
    err = capsys.readouterr().err
    assert re.search(r"max: +70%.*7/10.*sim t=42s", err)


def test_a_parallel_run_shows_a_bar_per_system(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # bars are drawn on a terminal only
    run_in_process(tmp_path / "run", "systems=[paged,oracle]", "jobs=2", "progress=true")
    err = capsys.readouterr().err
    assert "running 2 systems in 2 processes" in err
    for name in ("paged", "oracle"):  # each system's bar reached every request
        assert re.search(rf"{name}: 100%.*24/24", err), err[-2000:]
