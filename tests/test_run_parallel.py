"""``jobs``: the systems of a run in worker processes give the serial run's results, byte for
byte; Ctrl-C stops the workers and keeps what ran; bad values name the key."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.run.serve import resolve_jobs

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("workload=fixed", "workload.num_requests=24", "progress=false",
         "report=false")  # (no assertion reads the report; drawing it is most of the run)
SYSTEMS = ("paged", "max", "pow2", "oracle")
RUN_INFO_ONLY = ("created", "wall_time_s")  # timings: the only run_info fields that may differ


def run_in_process(out_dir: Path, *overrides: str) -> Path:
    """``run_serving`` in this process (torch is loaded here, so workers use forkserver)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.run.serve import run_serving

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*SMALL, *overrides])
    GlobalHydra.instance().clear()
    out_dir.mkdir(parents=True)
    run_serving(cfg, out_dir)
    return out_dir


def results_without_hash(run_dir: Path) -> dict:
    """results.json less config_hash, which covers every config key, ``jobs`` included."""
    results = json.loads((run_dir / "results.json").read_text())
    del results["config_hash"]
    return results


def test_parallel_runs_match_the_serial_run_byte_for_byte(tmp_path, run_cli):
    serial = run_in_process(tmp_path / "serial", "jobs=1")
    forked = run_cli(tmp_path / "fork", *SMALL, "jobs=2")  # no torch in the CLI: workers fork
    assert forked.returncode == 0, forked.stderr
    parallel = {"forkserver": run_in_process(tmp_path / "forkserver", "jobs=2"),
                "fork": tmp_path / "fork"}
    expected = results_without_hash(serial)
    assert list(expected["systems"]) == list(SYSTEMS)  # configured order
    tables = sorted(p.name for p in serial.glob("*.csv"))
    assert tables == sorted(f"{kind}_{s}.csv" for kind in ("steps", "requests") for s in SYSTEMS)
    for method, run_dir in parallel.items():
        assert json.dumps(results_without_hash(run_dir)) == json.dumps(expected), method
        for name in tables:
            assert (run_dir / name).read_bytes() == (serial / name).read_bytes(), (method, name)
        info = json.loads((run_dir / "run_info.json").read_text())
        assert info["jobs"] == 2 and list(info["systems"]) == list(SYSTEMS)
        assert all(entry["wall_time_s"] >= 0 for entry in info["systems"].values())
    assert json.loads((serial / "run_info.json").read_text())["jobs"] == 1


def interrupt_cli(proc: subprocess.Popen, after: str, wait_s: float) -> tuple[int, str]:
    """Ctrl-C the started ``python -m harness`` ``wait_s`` after a stderr line containing
    ``after``; (exit status, stderr)."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if after in line:
            break
    time.sleep(wait_s)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    return proc.returncode, "".join(seen) + rest


@pytest.mark.serial  # (a signal at a moment in the run: alone, not beside another worker)
def test_ctrl_c_stops_the_workers_and_writes_what_has_run(tmp_path, run_cli):
    # each system takes several seconds (max, the fastest, about 5 s on 2 cores on
    # 2026-12-05): two are running at Ctrl-C, oracle waits for a worker
    proc = run_cli.start(tmp_path, "workload=sharegpt_like", "workload.num_requests=60000",
                         "systems=[paged,max,oracle]", "jobs=2", stdout=subprocess.DEVNULL)
    status, stderr = interrupt_cli(proc, after="running 3 systems in 2 processes", wait_s=2)
    assert (status, "Traceback" in stderr) == (130, False), stderr
    assert "interrupted: writing what has run, marked incomplete" in stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["complete"], results["stop_reason"]) == (False, "interrupted")
    assert list(results["systems"]) == ["paged", "max"]  # oracle never started
    for name, summary in results["systems"].items():
        assert (summary["complete"], summary["stop_reason"]) == (False, "interrupted"), name
        assert summary["requests"]["finished"] > 0, name
        assert (tmp_path / f"steps_{name}.csv").exists()
    assert (tmp_path / "report.html").exists()


@pytest.mark.parametrize("value", [0, -1, "x", True, 1.5, None])
def test_bad_jobs_values_name_the_key(value):
    with pytest.raises(ConfigError, match=r"^jobs: must be a positive integer or 'auto'"):
        resolve_jobs(value, "sim", 4)


def test_bad_jobs_value_stops_the_cli_with_the_key(tmp_path, run_cli):
    proc = run_cli(tmp_path, *SMALL, "jobs=0")
    assert proc.returncode == 2 and "error: jobs: must be a positive integer" in proc.stderr


def test_jobs_resolve_to_at_most_one_process_per_system_and_one_on_torch(monkeypatch):
    import harness.run.serve

    monkeypatch.setattr(harness.run.serve, "usable_cpus", lambda: 8)
    assert resolve_jobs("auto", "sim", 4) == 4
    assert resolve_jobs("auto", "sim", 1) == 1
    assert resolve_jobs(3, "sim", 4) == 3
    assert resolve_jobs(16, "sim", 4) == 4
    assert resolve_jobs("auto", "torch", 4) == resolve_jobs(4, "torch", 4) == 1
