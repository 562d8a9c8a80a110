"""The CLI under bad input, interruption and limits: clear messages, no tracebacks, no hangs,
byte-identical results for a seed, and sweeps that skip jobs already done."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness.config.specs import EngineSpec
from harness.engine.engine import EngineStalled, run_engine
from harness.engine.plan import StepPlan
from harness.run.job_identity import config_hash
from harness.run.results import existing_complete_results

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["workload=docqa", "workload.num_requests=30", "progress=false"]
NO_REPORT = "report=false"  # where a test reads no report: drawing one is most of a small run




# ---------------------------------------------------------------- bad input
BAD_INPUTS = {
    "block_size_zero": (["block_size=0"], "block_size: must be a positive integer"),
    "negative_rate": (["workload.arrival.rate=-1"], "workload.arrival.rate"),
    "unknown_top_level_key": (["+foo=1"], "foo: unknown top-level key"),
    "misspelt_top_level_key": (["+blok_size=16"], "unknown top-level key. Did you mean 'block_size'?"),
    "misspelt_engine_key": (["+engine.max_num_seq=3"], "Did you mean 'max_num_seqs'?"),
    "unknown_workload_key": (["workload.bogus=1"], "workload.bogus: unknown key."),
    "misspelt_key_without_plus": (["blok_size=16"],
                                  "blok_size: unknown top-level key. Did you mean 'block_size'?"),
    "misspelt_engine_key_without_plus": (["engine.max_num_seq=3"], "Did you mean 'max_num_seqs'?"),
    "added_unknown_workload_key": (["+workload.bogus=1"], "workload.bogus: unknown key"),
    "weights_do_not_fit": (["model=llama-2-70b", "hardware=a100-40gb", "engine.tensor_parallel=1"],
                           "model=llama-2-70b does not fit hardware=a100-40gb"),
    "fits_no_nvlink_domain": (["model=deepseek-v3", "hardware=h200"],
                              "It needs tensor_parallel=16"),
    "unknown_system": (["systems=[paged,nope]"], "unknown system 'nope'"),
    "missing_trace_path": (["workload=azure_conv"], "workload.path is required"),
    "trace_file_not_found": (["workload=azure_conv", "workload.path=/nonexistent/trace.csv"],
                             "/nonexistent/trace.csv"),
    "trace_path_is_a_directory": (["workload=azure_conv", f"workload.path={ROOT}"],
                                  f"workload.path: {ROOT} is a directory"),
    "no_room_left_for_kv": (["engine.gpu_memory_utilization=0.1", "engine.tensor_parallel=1"],
                            "engine.gpu_memory_utilization=0.1"),
}


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory, run_cli):
    """Every bad-input case as a subprocess, all started at once (each is mostly imports)."""
    base = tmp_path_factory.mktemp("bad")
    procs = {name: run_cli.start(base / name, *args, "progress=false")
             for name, (args, _) in BAD_INPUTS.items()}
    out = {}
    for name, proc in procs.items():
        result = run_cli.wait(proc)
        out[name] = (result.returncode, result.output)
    return out


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_fails_with_a_clear_message_and_no_traceback(bad_input_runs, case):
    code, output = bad_input_runs[case]
    message = BAD_INPUTS[case][1]
    assert code != 0, output
    assert message in output, output
    assert "Traceback" not in output, output


def test_a_misspelt_key_is_a_config_error_with_or_without_plus(bad_input_runs):
    assert bad_input_runs["misspelt_key_without_plus"][0] == 2
    assert bad_input_runs["misspelt_top_level_key"][0] == 2


# -------------------------------------------------------------- determinism
def test_same_config_and_seed_give_byte_identical_results(tmp_path, run_cli):
    """Two processes with different hash salts, with prefix caching and preemption."""
    args = ["workload=docqa", "workload.num_requests=64", "workload.arrival.rate=8",
            "engine.kv_capacity_slots=4096", "block_size=8", "systems=[paged,pow2]", "progress=false",
            NO_REPORT]
    procs = [run_cli.start(tmp_path / str(i), *args, env={"PYTHONHASHSEED": str(salt)})
             for i, salt in enumerate((1, 2))]
    for proc in procs:
        result = run_cli.wait(proc)
        assert result.returncode == 0, result.stderr
    first, second = (tmp_path / "0" / "results.json").read_bytes(), (tmp_path / "1" / "results.json").read_bytes()
    assert first == second
    results = json.loads(first)
    assert results["complete"] and results["systems"]["paged"]["preemptions"] > 0
    assert results["systems"]["paged"]["prefix_cache"]["hit_rate"] > 0
    for table in sorted(p.name for p in (tmp_path / "0").glob("*.csv")):
        assert (tmp_path / "0" / table).read_bytes() == (tmp_path / "1" / table).read_bytes(), table


# ------------------------------------------------------ limits and stalls
@pytest.mark.serial  # (a 0.5 s wall-time limit: alone, not beside another worker)
def test_wall_time_limit_stops_the_run_and_marks_it_incomplete(tmp_path, run_cli):
    proc = run_cli(tmp_path, "workload=sharegpt_like", "workload.num_requests=5000",
                   "systems=[paged]", "engine.wall_time_limit_s=0.5", "progress=false",
                   timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "warning: results are incomplete (wall_time_limit_s=0.5 reached)" in proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    paged = results["systems"]["paged"]
    assert results["complete"] is False and paged["complete"] is False
    assert paged["stop_reason"] == "wall_time_limit_s=0.5 reached"
    assert 0 < paged["requests"]["finished"] < 5000
    assert (tmp_path / "report.html").exists()


class _NeverRuns:
    """A scheduler that holds work but can never plan a step."""

    class manager:
        capacity_slots = 16

        @staticmethod
        def breakdown(_):  # pragma: no cover - never reached
            raise AssertionError

        @staticmethod
        def fits_empty_pool(prompt_len, final_len):
            return True

    waiting, running, swapped = [object()], [], []

    def add(self, group):
        pass

    def has_work(self):
        return True

    def schedule(self):
        return StepPlan()


def test_a_workload_that_can_never_progress_stops_with_a_clear_message():
    with pytest.raises(EngineStalled, match="no step can run at t=0.000s with 1 waiting"):
        run_engine((), _NeverRuns(), executor=None, spec=EngineSpec(), max_model_len=4096)


def test_groups_that_can_never_fit_are_rejected_or_stop_clearly_through_the_cli(tmp_path, run_cli):
    """4 parallel samples each reserving max_model_len (4096) in a 3 x 4096-slot pool."""
    proc = run_cli(tmp_path, "workload=parallel_sampling", "workload.num_requests=8",
                   "systems=[max]", "engine.kv_capacity_slots=12288", "progress=false",
                   NO_REPORT, timeout=120)
    assert "Traceback" not in proc.stderr
    if proc.returncode == 0:  # rejected at arrival and counted
        results = json.loads((tmp_path / "results.json").read_text())
        assert results["systems"]["max"]["requests"]["rejected"] == 8
    else:  # all rejected, or stalled
        assert proc.returncode == 2, proc.stderr
        assert "error: no request can run on max" in proc.stderr or "error: no step can run" \
            in proc.stderr, proc.stderr


# ------------------------------------------------------------- interruption
@pytest.mark.serial  # (a signal at a moment in the run: alone, not beside another worker)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])  # SIGTERM: CI cancel, SLURM
def test_ctrl_c_or_sigterm_writes_what_has_run_marked_incomplete(tmp_path, run_cli, signum):
    # jobs=1: systems one after the other (tests/test_run_parallel.py interrupts jobs=2)
    proc = run_cli.start(tmp_path, "workload=sharegpt_like", "workload.num_requests=5000",
                         "systems=[paged,max]", "jobs=1")
    err: list[str] = []
    # (by line: off a terminal a run prints plain lines, no progress bar)
    reader = threading.Thread(target=lambda: err.extend(iter(proc.stderr.readline, "")))
    reader.start()
    deadline = time.monotonic() + 120
    while "paged:" not in "".join(err) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)  # "paged: simulating ...": the engine loop starts
    time.sleep(0.5)
    proc.send_signal(signum)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    stderr = "".join(err)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted: writing what has run, marked incomplete" in stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["complete"] is False and results["stop_reason"] == "interrupted"
    paged = results["systems"]["paged"]
    assert paged["complete"] is False and paged["stop_reason"] == "interrupted"
    assert paged["requests"]["finished"] > 0
    assert "max" not in results["systems"]  # the run stopped there
    assert (tmp_path / "steps_paged.csv").exists() and (tmp_path / "report.html").exists()
    # an interrupted run is not "done": the same command runs it again
    assert existing_complete_results(tmp_path, results["config_hash"]) is None


def test_sigterm_outside_a_run_unwinds_as_ctrl_c_does():
    """Between a sweep's jobs: KeyboardInterrupt, so the process exits through atexit (where a
    stopped sweep draws the report of the jobs that finished), not killed outright."""
    from harness.run.interrupts import terminate_as_interrupt

    previous = signal.getsignal(signal.SIGTERM)
    try:
        terminate_as_interrupt()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # (the handler runs at the next bytecode)
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------- sweep re-runs
def test_a_rerun_sweep_skips_jobs_with_complete_results_for_the_same_config(tmp_path, run_cli):
    sweep = tmp_path / "sweep"

    def sweep_run(block_sizes: str) -> subprocess.CompletedProcess:
        return run_cli(None, "-m", *SMALL, NO_REPORT, "systems=[paged,oracle]",
                       f"block_size={block_sizes}", f"hydra.sweep.dir={sweep}")

    first = sweep_run("8,16")
    assert first.returncode == 0, first.stderr
    stamps = {p: p.stat().st_mtime_ns for p in sweep.glob("*/results.json")}
    assert len(stamps) == 2
    # job 0 was interrupted last time: it runs again; job 1 is done: skipped
    job0 = json.loads((sweep / "0" / "results.json").read_text())
    job0["complete"] = False
    (sweep / "0" / "results.json").write_text(json.dumps(job0))
    second = sweep_run("8,16")
    assert second.returncode == 0, second.stderr
    assert second.stderr.count("skipped:") == 1 and f"{sweep / '1' / 'results.json'}" in second.stderr
    assert (sweep / "1" / "results.json").stat().st_mtime_ns == stamps[sweep / "1" / "results.json"]
    assert json.loads((sweep / "0" / "results.json").read_text())["complete"] is True
    # a job directory holding results of another config is not skipped
    job1 = json.loads((sweep / "1" / "results.json").read_text())
    assert existing_complete_results(sweep / "1", job1["config_hash"]) is not None
    assert existing_complete_results(sweep / "1", job0["config_hash"]) is None


def test_an_edited_relative_trace_is_run_again_with_hydra_job_chdir(tmp_path, run_cli):
    """hydra.job.chdir=true: the run's cwd is its run directory, but a relative trace path
    is the user's; the hash must read the trace the loader reads."""
    trace = tmp_path / "trace.csv"
    trace.write_text("i,o\n" + "".join(f"{10 + k},{4 + k}\n" for k in range(8)))

    def run():
        return run_cli(tmp_path / "run", "workload=table", "workload.path=trace.csv",
                       "workload.input_column=i", "workload.output_column=o", "systems=[paged]",
                       "jobs=1", "progress=false", "report=false", "hydra.job.chdir=true",
                       cwd=tmp_path, env={"PYTHONPATH": str(ROOT)}, timeout=180)

    first = run()
    assert first.returncode == 0, first.stderr
    assert "skipped:" in run().stderr  # unchanged: the same job
    trace.write_text(trace.read_text().replace("17,11", "99,11"))
    edited = run()
    assert edited.returncode == 0 and "skipped:" not in edited.stderr, edited.stderr
    assert (tmp_path / "run" / "previous" / "1" / "results.json").is_file()  # the first run's


def test_config_hash_ignores_display_only_keys_and_tracks_everything_else():
    cfg = {"block_size": 16, "seed": 0, "progress": True, "workload": {"num_requests": 4}}
    assert config_hash(cfg) == config_hash({**cfg, "progress": False})
    assert config_hash(cfg) != config_hash({**cfg, "seed": 1})
    assert config_hash(cfg) != config_hash({**cfg, "workload": {"num_requests": 5}})


def test_config_hash_follows_the_content_of_the_trace_it_reads(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n")
    cfg = {"block_size": 16, "workload": {"name": "azure_conv", "path": str(trace)}}
    before = config_hash(cfg)
    assert config_hash(cfg) == before
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3740,44\n")
    assert config_hash(cfg) != before  # an edited trace is not "already done"
    mooncake = {"workload": {"trace": {"path": str(trace)}}}  # nested, as conf/workload/mooncake
    assert config_hash(mooncake) != config_hash({"workload": {"trace": {"path": "/no/such"}}})


# ------------------------------------------------------ earlier outputs are kept
def test_a_run_into_a_directory_with_an_earlier_run_moves_it_aside_never_over_it(tmp_path,
                                                                                 run_cli):
    first = run_cli(tmp_path, *SMALL, "systems=[paged,max]")
    assert first.returncode == 0, first.stderr
    kept = {name: (tmp_path / name).read_bytes()
            for name in ("results.json", "config_resolved.yaml", "steps_max.csv", "report.html")}
    bad = run_cli(tmp_path, *SMALL, "block_size=0")
    assert bad.returncode == 2 and "error: block_size" in bad.stderr and "Traceback" not in bad.stderr
    assert "moved" not in bad.stderr  # refused before the directory changes
    for name, data in kept.items():  # byte for byte, where they were
        assert (tmp_path / name).read_bytes() == data
    again = run_cli(tmp_path, *SMALL, "systems=[paged]", NO_REPORT)
    assert again.returncode == 0, again.stderr
    assert f"moved them to {tmp_path / 'previous' / '1'}" in again.stderr
    for name, data in kept.items():  # byte for byte, and none left beside the new run's
        assert (tmp_path / "previous" / "1" / name).read_bytes() == data
    assert not (tmp_path / "steps_max.csv").exists()  # no table of a system it did not run
    assert list(json.loads((tmp_path / "results.json").read_text())["systems"]) == ["paged"]
    assert sorted(p.name for p in (tmp_path / "previous").iterdir()) == ["1"]
    probe = tmp_path / "probe.txt"  # outputs get a plain file's mode (mkstemp's is 0600)
    probe.write_text("")
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == probe.stat().st_mode & 0o777


def test_a_failed_sweep_job_does_not_report_an_earlier_runs_results(tmp_path, run_cli):
    sweep = tmp_path / "sweep"

    def sweep_run(block_sizes: str) -> subprocess.CompletedProcess:
        return run_cli(None, "-m", *SMALL, NO_REPORT, "systems=[paged]",
                       f"block_size={block_sizes}", f"hydra.sweep.dir={sweep}")

    assert sweep_run("8").returncode == 0
    earlier = (sweep / "0" / "results.json").read_bytes()
    failed = sweep_run("0")  # job 0 again, now with a bad block size
    assert failed.returncode != 0 and "error: block_size" in failed.stderr
    # the earlier sweep's job is not in this one: set aside whole, before the sweep starts
    assert (sweep / "previous" / "1" / "0" / "results.json").read_bytes() == earlier
    assert not (sweep / "0" / "results.json").exists()
    from pagebench.reports.sweep import collect_jobs

    [job] = collect_jobs(sweep)
    assert job.status == "failed" and "block_size" in job.reason


def test_a_trace_path_under_home_is_hashed_so_an_edit_is_noticed(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    trace = tmp_path / "trace.csv"
    trace.write_text("p,o\n10,5\n")
    cfg = {"workload": {"kind": "table", "path": "~/trace.csv"}}
    before = config_hash(cfg)
    trace.write_text("p,o\n300,5\n")
    assert config_hash(cfg) != before
