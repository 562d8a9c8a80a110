"""Two-job sweeps through every launcher that can run here (slow: each starts processes).

basic (Hydra's own, with a failing job), joblib (``local_parallel``), Submitit's local
executor (``local_submitit``) and Ray (``ray_cluster``, against a local Ray instance
this test starts on 127.0.0.1 and stops). Each sweep must leave one run directory per
job and a sweep report at the top that counts them.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_report import parse

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["workload=fixed", "workload.num_requests=12", "workload.prompt_len=64",
         "workload.output_len=16", "systems=[paged,oracle]", "progress=false"]

pytestmark = pytest.mark.slow


def needs(plugin: str) -> None:
    if importlib.util.find_spec(f"hydra_plugins.{plugin}") is None:
        pytest.skip(f"{plugin} is not installed (pip install -e '.[sweeps]')")


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                    os.environ.get("PYTHONPATH")])))
    out.update(extra)
    return out


def sweep(sweep_dir: Path, *overrides: str, extra_env: dict | None = None,
          timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", "-m", *SMALL, *overrides, f"hydra.sweep.dir={sweep_dir}"],
        cwd=ROOT, env=env(**(extra_env or {})), capture_output=True, text=True, timeout=timeout)


def check_finished(sweep_dir: Path, proc: subprocess.CompletedProcess, jobs: int = 2) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    for num in range(jobs):
        assert (sweep_dir / str(num) / "results.json").exists(), proc.stderr[-3000:]
        assert (sweep_dir / str(num) / "report.html").exists()
    report = sweep_dir / "sweep_report.html"
    assert report.exists(), proc.stderr[-3000:]
    meta = report.read_text()
    assert f"{jobs} jobs: finished <b>{jobs}</b>" in meta
    rows = parse(report).tables["sweep-table"][1:]
    assert len(rows) == 2 * jobs and {r[2] for r in rows} == {"8", "16"}


def test_basic_launcher_sweep_reports_a_failed_job_and_shows_progress(tmp_path):
    out = tmp_path / "sweep"
    proc = sweep(out, "block_size=0,16")
    assert proc.returncode != 0  # Hydra reports the failed job after running the others
    assert "sweep: 2 jobs" in proc.stderr and "1/2 jobs finished" in proc.stderr
    assert (out / "1" / "results.json").exists()
    assert "block_size" in (out / "0" / "job_failed.txt").read_text()
    tables = parse(out / "sweep_report.html").tables
    assert tables["unfinished-table"][1][2] == "failed"
    assert {r[2] for r in tables["sweep-table"][1:]} == {"16"}


def test_joblib_launcher_sweep(tmp_path):
    needs("hydra_joblib_launcher")
    out = tmp_path / "sweep"
    check_finished(out, sweep(out, "block_size=8,16", "hydra/launcher=local_parallel",
                              "hydra.launcher.n_jobs=2"))


def test_submitit_local_launcher_sweep(tmp_path):
    needs("hydra_submitit_launcher")
    out = tmp_path / "sweep"
    proc = sweep(out, "block_size=8,16", "hydra/launcher=local_submitit")
    check_finished(out, proc)
    assert (out / ".submitit").is_dir()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_launcher_sweep_on_a_local_ray_instance(tmp_path):
    needs("hydra_ray_launcher")
    port = free_port()
    # Loopback only: without this, Ray binds and talks to the machine's external address.
    ray_env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    temp = Path("/tmp") / f"pbray{os.getpid()}"  # Ray's socket paths must stay short
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         f"--port={port}", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
         f"--temp-dir={temp}", "--object-store-memory=100000000"],
        cwd=ROOT, env=env(**ray_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert head.poll() is None, head.stdout.read()
            assert time.monotonic() < deadline, "the Ray head did not start in 120 s"
            time.sleep(1)
        out = tmp_path / "sweep"
        proc = sweep(out, "block_size=8,16", "hydra/launcher=ray_cluster",
                     extra_env={**ray_env, "RAY_ADDRESS": f"127.0.0.1:{port}"}, timeout=400)
        check_finished(out, proc)
    finally:
        head.terminate()  # `ray start --block` drains and stops every process it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        import shutil

        shutil.rmtree(temp, ignore_errors=True)
