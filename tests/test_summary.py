"""The end-of-run console summary and the overload signal (pagebench.reports.summary)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from pagebench.reports.summary import overload_lines, print_run_summary, print_sweep_summary
from pagebench.reports.headline import load_parts


def mooncake_like(offered: float = 3.40, served: float = 1.67, drain: float = 7213.0,
                  span: float = 3537.0, process: str = "trace") -> dict:
    """results.json of the default ``workload=mooncake`` run, as the issue measured it."""
    paged = {"allocator": {"kind": "paged"}, "requests": {"rejected": 0},
             "memory": {"token_states_pct": 90.0, "idle_pct": 0.0}, "preemptions": 5210,
             "throughput": {"requests_per_s": served, "makespan_s": drain},
             "latency": {"ttft_s": {"p50": 1800.0}, "e2e_s": {"p50": 1850.0}},
             "prefix_cache": {"hit_tokens": 84.0e6, "readmission_hit_tokens": 76.6e6}}
    return {"workload": {"mean_rate_rps": offered, "arrival_span_s": span,
                         "arrival_process": process}, "systems": {"paged": paged}}


def test_an_overloaded_run_is_named_with_its_rates_drain_time_and_readmissions():
    sentence, lines = overload_lines(mooncake_like())
    assert sentence.startswith("Queueing dominates latency: requests arrive faster than paged "
                               "serves them")
    assert lines == ["paged: serves 1.67 of the offered 3.40 req/s; 7,213 s to drain a 3,537 s "
                     "trace; TTFT p50 1,800.0 s of an end-to-end p50 of 1,850.0 s; 76.6M of its "
                     "84.0M prefix-hit tokens are re-admissions after preemption (its own freed "
                     "blocks), not sharing"]


def test_a_system_that_keeps_up_or_an_offline_batch_is_not_overloaded():
    assert overload_lines(mooncake_like(offered=1.70)) is None          # served ~ offered
    assert overload_lines(mooncake_like(drain=3600.0)) is None          # drains with the trace
    offline = mooncake_like(span=0.0)
    offline["workload"]["mean_rate_rps"] = None                         # all at t=0
    assert overload_lines(offline) is None


def test_the_report_top_says_so_and_escapes_it():
    results = mooncake_like()
    results["systems"]["<b>x</b>"] = results["systems"].pop("paged")
    html = "".join(load_parts(results))
    assert "id='load'>Offered load <b>3.40 req/s</b> over a 3,537 s trace" in html
    assert "id='overload'" in html and "&lt;b&gt;x&lt;/b&gt;: serves 1.67" in html
    assert "<b>x</b>" not in html
    assert "id='overload'" not in "".join(load_parts(mooncake_like(offered=1.70)))


def test_summary_of_a_serving_run_lists_each_system_then_the_paths(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(mooncake_like()))
    (tmp_path / "report.html").write_text("<html></html>")
    out = io.StringIO()
    print_run_summary(tmp_path, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "summary:"
    assert lines[1].split() == ["token", "states", "%", "waste", "%", "req/s", "TTFT", "p50",
                                "(s)", "preemptions", "drain", "(s)"]
    assert lines[2].split() == ["paged", "90.0", "10.0", "1.67", "1,800", "5,210", "7,213"]
    assert lines[3] == "  offered load: 3.40 req/s over a 3,537 s trace"
    assert lines[4].startswith("note: Queueing dominates latency")
    assert lines[-2:] == [f"results.json: {tmp_path / 'results.json'}",
                          f"report.html: {tmp_path / 'report.html'}"]


def test_summary_of_a_kernel_run_says_where_its_results_went(tmp_path):
    from test_report import kernel_results

    data = kernel_results()
    data["timings"] = "cpu"
    (tmp_path / "kernel_results.json").write_text(json.dumps(data))
    out = io.StringIO()
    print_run_summary(tmp_path, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "summary of the kernel benchmark (CPU: torch's reference paths):"
    assert lines[1].startswith("  llama-2-13b: paged / contiguous decode time median 1.030 "
                               "(min 1.020, max 1.150) over 12 points")
    assert lines[-1] == f"kernel_results.json: {tmp_path / 'kernel_results.json'}"


def test_summary_of_a_study_has_a_line_per_job(tmp_path):
    system = mooncake_like()["systems"]["paged"]
    study = {"study": "vllm_fig2", "jobs": [{"key": "sharegpt", "system": name,
                                             "summary": system} for name in ("vllm", "orca_max")]}
    (tmp_path / "study.json").write_text(json.dumps(study))
    out = io.StringIO()
    print_run_summary(tmp_path, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "summary of study vllm_fig2 (2 jobs):"
    assert [line.split()[:2] for line in lines[2:4]] == [["sharegpt", "vllm"],
                                                          ["sharegpt", "orca_max"]]
    assert lines[-1] == f"study.json: {tmp_path / 'study.json'}"


def test_summary_of_a_sweep_has_a_line_per_job_and_system(tmp_path):
    from pagebench.reports.sweep import Job

    results = mooncake_like()
    jobs = [Job("0", ["workload=docqa", "block_size=8"], "finished", results=results),
            Job("1", ["workload=docqa", "block_size=16"], "finished", results=results),
            Job("2", ["workload=docqa", "block_size=32"], "failed")]
    (tmp_path / "sweep_report.html").write_text("<html></html>")
    out = io.StringIO()
    print_sweep_summary(tmp_path, jobs, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "summary of the sweep (2 of 3 jobs with results):"
    # each line names its job by what the sweep varied, not by every override
    assert [line.split()[:3] for line in lines[2:4]] == [["0", "block_size=8", "paged"],
                                                          ["1", "block_size=16", "paged"]]
    assert lines[-1] == f"sweep_report.html: {tmp_path / 'sweep_report.html'}"


def test_latencies_read_as_plain_numbers():
    from pagebench.reports.summary import readable_seconds

    assert [readable_seconds(v) for v in (2303.6, 3730.3, 23.04, 1.0, 0.03116, 0.0)] == \
        ["2,304", "3,730", "23.0", "1.00", "0.0312", "0"]


def test_a_run_off_a_terminal_draws_no_bars_and_logs_its_summary(tmp_path, run_cli):
    done = run_cli(tmp_path, "workload=docqa", "workload.num_requests=20", "report=false",
                   "systems=[paged,max]")  # progress=true (the default), stderr a pipe
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "\x1b" not in done.stderr and "req/s]" not in done.stderr
    log = (tmp_path / "pagebench.log").read_text()
    summary = done.stderr[done.stderr.index("summary:"):]
    assert summary.strip() and summary in log


def test_the_overload_note_says_what_a_saturated_run_still_measures():
    from pagebench.reports.summary import overload_lines

    sentence, _ = overload_lines(mooncake_like())
    assert "The memory figures are a saturated server's, the setting of the article's claims" \
        in sentence
