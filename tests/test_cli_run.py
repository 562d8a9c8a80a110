"""The default command end to end, as a user runs it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

QUIET = "progress=false"  # (no progress bars in the captured stderr)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, run_cli):
    out = tmp_path_factory.mktemp("default_run")
    proc = run_cli(out, "workload=docqa", "block_size=16", QUIET, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_default_command_writes_every_output(default_run):
    out, proc = default_run
    for name in ("config_resolved.yaml", "results.json", "run_info.json", "report.html"):
        assert (out / name).is_file(), name
    results = json.loads((out / "results.json").read_text())
    assert set(results["systems"]) == {"paged", "max", "pow2", "oracle"}
    for system in results["systems"]:
        steps = pd.read_csv(out / f"steps_{system}.csv")
        requests = pd.read_csv(out / f"requests_{system}.csv")
        assert len(steps) > 0 and len(requests) == results["workload"]["num_requests"]
    assert "steps/s" in proc.stderr and "wall time" in proc.stderr
    # the end-of-run summary (pagebench.reports.summary): a line per system, then where the files are
    summary = proc.stderr[proc.stderr.index("\nsummary:\n"):]
    assert [line.split()[0] for line in summary.splitlines()[3:7]] == list(results["systems"])
    assert f"results.json: {out / 'results.json'}" in summary
    assert f"report.html: {out / 'report.html'}" in summary


def test_default_command_breakdown_is_complete_and_paged_packs_more(default_run):
    out, _ = default_run
    systems = json.loads((out / "results.json").read_text())["systems"]
    for name, summary in systems.items():
        memory = summary["memory"]
        total = sum(memory[k] for k in ("token_states_pct", "reserved_pct",
                                        "internal_fragmentation_pct",
                                        "external_fragmentation_pct", "idle_pct"))
        assert total == pytest.approx(100.0, abs=1e-2), name
        assert summary["requests"]["finished"] > 0
    paged = systems["paged"]
    for name in ("max", "pow2", "oracle"):
        assert paged["memory"]["token_states_pct"] > systems[name]["memory"]["token_states_pct"]
        assert paged["batch"]["mean_seqs"] > systems[name]["batch"]["mean_seqs"]
    assert paged["prefix_cache"]["hit_rate"] > 0 and paged["sharing_savings_pct"] > 0


def test_request_longer_than_the_pool_is_rejected_counted_and_reported(tmp_path, run_cli):
    proc = run_cli(tmp_path, "workload=fixed", "workload.num_requests=4",
                   "engine.kv_capacity_slots=400", "systems=[paged,oracle]", QUIET)
    # every request rejected: an error (exit 2) that says why, the results kept for a look
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "warning: paged rejected 4 of 4 requests that can never run on it (larger_than_pool: " \
           "4; the KV pool holds 400 slots)" in proc.stderr
    assert "raise engine.kv_capacity_slots" in proc.stderr
    assert "error: no request can run on paged, oracle: it rejected every request" in proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["complete"] is False and len(results["warnings"]) == 2
    for summary in results["systems"].values():
        assert summary["requests"] == {"finished": 0, "rejected": 4, "unfinished": 0}
        assert summary["rejected_reasons"] == {"larger_than_pool": 4}
    assert "Warning: paged rejected 4 of 4" in (tmp_path / "report.html").read_text()


def test_requests_only_some_systems_can_run_are_named_on_the_console(tmp_path, run_cli):
    proc = run_cli(tmp_path, "workload=docqa", "workload.num_requests=60",
                   "engine.kv_capacity_slots=2000", "systems=[paged,oracle]", QUIET)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["complete"] is True
    paged, oracle = (results["systems"][name]["requests"] for name in ("paged", "oracle"))
    assert 0 < paged["rejected"] < oracle["rejected"] < 60  # the buddy arena's 1024-slot limit
    assert f"warning: oracle rejected {oracle['rejected']} of 60 requests" in proc.stderr
    assert "buddy arena's largest extent" in proc.stderr
    assert "id='headline'" not in (tmp_path / "report.html").read_text()  # not the same work


def test_the_console_says_what_the_workload_left_out():
    from harness.run.serve import _workload_notes

    rows = {"rows_read": 200, "skipped": {"total": 2}, "filtered": {"total": 5},
            "dropped": {"total": 30}, "truncated": {"total": 0}}
    assert _workload_notes(rows, 4096) == [
        "2 malformed rows skipped (workload.on_error=skip)",
        "30 requests dropped: longer than max_model_len=4096 (workload.clip=truncate keeps them, "
        "shortened)"]
    assert _workload_notes({}, 4096) == []


def test_report_false_skips_the_report_and_a_rerun_renders_it_without_running(tmp_path, run_cli):
    small = ("workload=docqa", "workload.num_requests=20", "systems=[paged,max]", QUIET)
    proc = run_cli(tmp_path, *small, "report=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "results.json").is_file() and not (tmp_path / "report.html").exists()
    results = (tmp_path / "results.json").read_text()
    proc = run_cli(tmp_path, *small)  # the same results (report is not part of the job's identity)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipped:" in proc.stderr and f"report: {tmp_path / 'report.html'}" in proc.stderr
    assert (tmp_path / "report.html").is_file()
    assert (tmp_path / "results.json").read_text() == results
    proc = run_cli(tmp_path, *small, "report=maybe")
    assert proc.returncode == 2 and "report: must be true or false, got 'maybe'" in proc.stderr
