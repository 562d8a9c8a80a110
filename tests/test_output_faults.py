"""Outputs that cannot be written (disk full, read-only, a file where a directory must be)
stop a run with one line and exit 2, and nothing half-written counts as complete."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.errors import OutputError
from harness.fileio import atomic_write_text
from harness.run.results import existing_complete_results, set_aside_previous_run

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("workload=fixed", "workload.num_requests=24", "systems=[paged]", "jobs=1",
         "progress=false", "report=false")


def test_disk_full_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    target.write_text("old")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("harness.run.results.os.replace", full)
    with pytest.raises(OutputError, match=rf"^{target}: cannot write it: no space left on the "
                                          r"device \(free some, or write elsewhere"):
        atomic_write_text(target, "new")
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"] and target.read_text() == "old"


def test_disk_full_while_a_table_streams_leaves_the_old_file_and_no_temporary(tmp_path,
                                                                             monkeypatch):
    """write_table writes as pyarrow formats: a write that fails part way is the same one
    line, and the earlier table stays whole."""
    import pandas as pd

    from harness.run.results import write_table

    target = tmp_path / "steps_paged.csv"
    target.write_text("old")
    real_fdopen = os.fdopen

    class FullDisk:  # takes 64 KiB, then the disk is full
        def __init__(self, fd, mode):
            self.file, self.written = real_fdopen(fd, mode), 0

        def write(self, data):
            self.written += len(data)
            if self.written > 1 << 16:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.file.write(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    monkeypatch.setattr("harness.fileio.os.fdopen", FullDisk)
    with pytest.raises(OutputError, match=rf"^{target}: cannot write it: no space left"):
        write_table(target, pd.DataFrame({"step": range(100_000), "time_s": 0.5}))
    assert [p.name for p in tmp_path.iterdir()] == [target.name] and target.read_text() == "old"


# python -m harness with one OSError injected where a run writes (root ignores chmod, so a
# read-only directory is simulated too)
INJECT = textwrap.dedent("""
    import errno, os, runpy, sys, tempfile
    where, code = sys.argv.pop(1), getattr(errno, sys.argv.pop(1))
    real_replace, real_mkstemp = os.replace, tempfile.mkstemp
    def replace(src, dst, *a, **k):
        if where == "replace" and os.path.basename(dst) == "results.json":
            raise OSError(code, os.strerror(code))
        return real_replace(src, dst, *a, **k)
    def mkstemp(*a, **k):
        if where == "mkstemp" and k.get("prefix", "").startswith(".steps_"):
            raise OSError(code, os.strerror(code), k["dir"])
        return real_mkstemp(*a, **k)
    os.replace, tempfile.mkstemp = replace, mkstemp
    sys.argv[0] = "harness"
    runpy.run_module("harness", run_name="__main__", alter_sys=True)
""")


@pytest.mark.parametrize("where, code, why", [
    ("replace", "ENOSPC", "results.json: cannot write it: no space left on the device"),
    ("mkstemp", "EROFS", "steps_paged.csv: cannot write it: Read-only file system (a read-only "
                         "or protected directory: write elsewhere)")])
def test_a_write_that_fails_stops_the_run_with_one_line(tmp_path, where, code, why):
    proc = subprocess.run([sys.executable, "-c", INJECT, where, code, *SMALL,
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {tmp_path}/") and why in errors[0]
    assert not (tmp_path / "results.json").exists()  # nothing counts as done: the next run runs
    assert not list(tmp_path.glob(".*.csv.*")) + list(tmp_path.glob(".*.json.*"))  # no temporary


def test_previous_as_a_file_is_refused_and_the_earlier_outputs_stay(tmp_path):
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "previous").write_text("mine")
    with pytest.raises(OutputError, match=rf"^{tmp_path / 'previous'}: is a file; pagebench "
                                          r"moves earlier runs' outputs into a directory"):
        set_aside_previous_run(tmp_path)
    assert (tmp_path / "results.json").read_text() == "{}"
    assert (tmp_path / "previous").read_text() == "mine"


def test_previous_as_a_file_stops_the_cli_with_exit_2(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"schema_version": 1}))
    (tmp_path / "previous").write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "harness", *SMALL, f"hydra.run.dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: {tmp_path / 'previous'}: is a file" in proc.stderr
    assert existing_complete_results(tmp_path, "x") is None
    assert json.loads((tmp_path / "results.json").read_text()) == {"schema_version": 1}
