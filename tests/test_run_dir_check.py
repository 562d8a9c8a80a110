"""A run directory that cannot be used is refused in one line (exit 2) before Hydra creates
anything in it: a file, a path under a file, a name too long, under /proc, a lock path that
is a directory, a read-only file system (new, or holding an earlier run: left as it was)."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest

import harness.run.run_dir_check as check

SMALL = ["workload.num_requests=5", "progress=false", "report=false"]


def _refused(run_cli, run_dir, *args: str) -> str:
    done = run_cli(run_dir, *SMALL, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: hydra.run.dir={run_dir}: ")
    return done.stderr


def test_a_file_and_a_path_under_a_file_are_refused(tmp_path, run_cli):
    blocker = tmp_path / "a_file"
    blocker.write_text("mine")
    assert f"{blocker} is a file, not a directory" in _refused(run_cli, blocker)
    assert f"{blocker} is a file, not a directory" in _refused(run_cli, blocker / "run")
    assert blocker.read_text() == "mine"


def test_a_too_long_name_and_a_kernel_file_system_are_refused(tmp_path, run_cli):
    assert "is 300 bytes long, more than the 255" in _refused(run_cli, tmp_path / ("x" * 300))
    assert "cannot create it: No such file or directory (a kernel file system" in _refused(
        run_cli, Path("/proc/pagebench_run"))


def test_a_lock_path_that_is_a_directory_is_refused(tmp_path, run_cli):
    (tmp_path / ".pagebench.lock").mkdir()
    assert ".pagebench.lock is not a file (pagebench keeps its run lock there): remove it" in \
        _refused(run_cli, tmp_path)
    assert not (tmp_path / ".hydra").exists()


def test_an_unwritable_directory_is_named_with_the_reason(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(check.tempfile, "mkstemp", read_only)
    assert check.run_dir_problem(tmp_path) == ("cannot write into it: Read-only file system (a "
                                               "read-only or protected directory: write elsewhere)")


@pytest.fixture
def tmpfs(tmp_path):
    mount = tmp_path / "mnt"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "none", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_read_only_file_system_holding_an_earlier_run_is_left_as_it_was(tmpfs, run_cli):
    run_dir = tmpfs / "run"
    assert run_cli(run_dir, *SMALL).returncode == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    assert "cannot write into it: Read-only file system" in _refused(run_cli, run_dir)
    assert "cannot create it: Read-only file system" in _refused(run_cli, tmpfs / "new")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_refused_run_leaves_the_earlier_runs_hydra_files_beside_its_results(tmp_path, run_cli):
    assert run_cli(tmp_path, *SMALL, "block_size=8").returncode == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / ".hydra").glob("*.yaml")}
    refused = run_cli(tmp_path, *SMALL, "block_size=0")
    assert refused.returncode == 2 and "error: block_size" in refused.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / ".hydra").glob("*.yaml")} == before
    assert b"block_size=8" in before["overrides.yaml"]
