"""Who may write into a run directory: workers end with their parent (``kill -9`` leaves no
orphan to write into a later run), one run at a time holds the directory, and a process
whose claim was taken over writes nothing there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.fileio import write_json
from harness.run.run_lock import LOCK_NAME, RunDirectoryBusy, claim_run_dir

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("workload=fixed", "workload.num_requests=24", "progress=false", "report=false")


def children_of(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry))
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (not gone, not zombies)."""
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


def wait_until_gone(pids: set[int], timeout_s: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


def run_cli(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *overrides, f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.serial  # (a signal at a moment in the run: alone, not beside another worker)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_kill_9_leaves_no_worker_to_write_into_a_later_run(tmp_path):
    command = [sys.executable, "-m", "harness", "workload=sharegpt_like",
               "workload.num_requests=20000", "systems=[paged,max,oracle]", "jobs=2",
               "progress=false", "report=false", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    for line in proc.stderr:
        if "running 3 systems in 2 processes" in line:
            break
    deadline = time.monotonic() + 30
    while len(workers := children_of(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) >= 2
    time.sleep(0.5)  # both simulating
    proc.kill()
    proc.wait(timeout=30)
    assert wait_until_gone(workers) == set()  # no orphan goes on simulating

    later = run_cli(tmp_path, *SMALL, "systems=[paged]", "jobs=1")
    assert later.returncode == 0, later.stderr
    time.sleep(1.0)  # what an orphan would have written by now
    tables = sorted(path.name for path in tmp_path.glob("*.csv"))
    assert tables == ["requests_paged.csv", "steps_paged.csv"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["complete"], list(results["systems"])) == (True, ["paged"])
    assert len((tmp_path / "requests_paged.csv").read_text().splitlines()) == 24 + 1


POOL_SCRIPT = textwrap.dedent("""
    import multiprocessing, os, sys, time
    from harness.processes import worker_pool
    pool = worker_pool(2, multiprocessing.get_context(sys.argv[1]))
    futures = [pool.submit(time.sleep, 600) for _ in range(2)]
    while len(pool._processes) < 2:
        time.sleep(0.01)
    time.sleep(0.3)  # the workers are past their initializer, sleeping
    print(" ".join(str(pid) for pid in pool._processes), flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_pool_workers_end_with_their_parent(method):
    proc = subprocess.Popen([sys.executable, "-c", POOL_SCRIPT, method], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    workers = {int(pid) for pid in proc.stdout.readline().split()}
    assert len(workers) == 2 and alive(workers) == workers
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert wait_until_gone(workers) == set()


def test_a_process_whose_claim_was_taken_over_writes_nothing(tmp_path):
    with claim_run_dir(tmp_path):
        write_json(tmp_path / "mine.json", {"ok": 1})  # the owner writes
        (tmp_path / LOCK_NAME).write_text("4242 another-run\n")  # a later run took it over
        with pytest.raises(RunDirectoryBusy, match=r"another run \(pid 4242\) owns this "
                                                   r"directory now"):
            write_json(tmp_path / "results.json", {"stale": 1})
    assert sorted(path.name for path in tmp_path.iterdir()) == [LOCK_NAME, "mine.json"]
    write_json(tmp_path / "later.json", {"ok": 1})  # no claim held: anyone's directory


def test_a_second_run_into_a_held_directory_is_refused(tmp_path):
    with claim_run_dir(tmp_path):
        with pytest.raises(RunDirectoryBusy, match=r"another run \(pid \d+\) is writing"):
            with claim_run_dir(tmp_path):
                pass
        proc = run_cli(tmp_path, *SMALL)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {tmp_path}: another run (pid {os.getpid()}) is writing into this "
                      "directory; wait for it to end or choose another (hydra.run.dir=...)"]
    assert not (tmp_path / "results.json").exists()
    with claim_run_dir(tmp_path):  # released: the next run takes it
        pass
