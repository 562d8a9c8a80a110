"""The regression gate: passes on identical results, fails on an injected regression,
--update round-trips, bad files give a clear error (exit 2) and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import gate
from harness.results_format import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]


def _system(kind: str, token_states: float, tokens_per_s: float, e2e_p50: float,
            preemptions: int = 0) -> dict:
    rest = 100.0 - token_states
    return {
        "allocator": {"kind": kind},
        "memory": {"token_states_pct": token_states, "reserved_pct": rest / 4,
                   "internal_fragmentation_pct": rest / 4, "external_fragmentation_pct": rest / 4,
                   "idle_pct": rest / 4, "sharing_savings_pct": 0.0},
        "requests": {"finished": 50, "rejected": 0, "unfinished": 0},
        "throughput": {"requests_per_s": tokens_per_s / 40, "output_tokens_per_s": tokens_per_s},
        "latency": {"ttft_s": {"p50": 0.1, "p99": 0.5}, "tpot_s": {"p50": None},
                    "e2e_s": {"p50": e2e_p50, "p99": 2 * e2e_p50},
                    "normalized_s_per_token": {"p50": 0.02}},
        "batch": {"mean_seqs": 12.5, "max_seqs": 30},
        "preemptions": preemptions, "swaps": 0,
        "prefix_cache": {"hit_rate": 0.25},
        "complete": True,
    }


def make_results(block_size: int = 16, executor: str = "sim") -> dict:
    return {
        "schema_version": SCHEMA_VERSION, "complete": True, "config_hash": "abc",
        "executor": executor, "seed": 0, "block_size": block_size,
        "workload": {"name": "docqa", "num_requests": 50},
        "model": {"name": "llama-2-13b"}, "hardware": {"name": "a100-80gb"},
        "systems": {"paged": _system("paged", 80.0, 1000.0, 1.0, preemptions=3),
                    "max": _system("contiguous", 30.0, 400.0, 2.0)},
    }


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture
def baseline(tmp_path: Path) -> Path:
    run = write(tmp_path / "base" / "results.json", make_results())
    path = tmp_path / "baseline.json"
    assert gate.main([str(run), "--baseline", str(path), "--update"]) == 0
    return path


def run_gate(tmp_path: Path, results: dict | list[dict], baseline: Path, *extra: str):
    items = results if isinstance(results, list) else [results]
    paths = [str(write(tmp_path / f"cur{i}" / "results.json", r)) for i, r in enumerate(items)]
    out = tmp_path / "report"
    code = gate.main([*paths, "--baseline", str(baseline), "--out", str(out), *extra])
    report = json.loads((out / "gate.json").read_text()) if (out / "gate.json").exists() else None
    return code, report


def verdicts(report: dict) -> dict[str, str]:
    return {row["metric"]: row["verdict"] for row in report["rows"]}


def test_identical_results_pass_and_write_json_and_markdown(tmp_path, baseline):
    code, report = run_gate(tmp_path, make_results(), baseline)
    assert code == 0 and report["passed"]
    assert set(verdicts(report).values()) <= {"pass", "info"}
    md = (tmp_path / "report" / "gate.md").read_text()
    assert md.startswith("## pagebench gate: PASS")
    assert "| metric | baseline | current | delta | rule | verdict |" in md
    # within-run ratios are gated too
    assert verdicts(report)["ratio.paged/max.throughput.output_tokens_per_s"] == "pass"


def test_injected_memory_regression_fails(tmp_path, baseline, capsys):
    worse = make_results()
    worse["systems"]["paged"]["memory"]["token_states_pct"] -= 0.5
    code, report = run_gate(tmp_path, worse, baseline)
    assert code == 1 and not report["passed"]
    assert verdicts(report)["paged.memory.token_states_pct"] == "REGRESSION"
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "gate: FAIL" in out
    assert "**REGRESSION**" in (tmp_path / "report" / "gate.md").read_text()


@pytest.mark.parametrize("path, value, verdict", [
    (("preemptions",), 4, "REGRESSION"),  # counts: no tolerance
    (("preemptions",), 2, "improved"),
    (("memory", "token_states_pct"), 80.005, "pass"),  # inside the 0.01 tolerance
    (("memory", "token_states_pct"), 80.5, "improved"),
    (("memory", "idle_pct"), 1.0, "info"),  # the complement: reported, not gated
    (("throughput", "output_tokens_per_s"), 990.0, "REGRESSION"),  # simulated time is exact
    (("latency", "tpot_s", "p50"), 0.5, "CHANGED"),  # None -> a number
])
def test_each_rule_direction_and_tolerance(tmp_path, baseline, path, value, verdict):
    current = make_results()
    node = current["systems"]["paged"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    code, report = run_gate(tmp_path, current, baseline)
    assert verdicts(report)[f"paged.{'.'.join(path)}"] == verdict
    assert code == (1 if verdict in gate.FAILING else 0)


def test_measured_executor_gates_only_within_run_ratios(tmp_path):
    base_path = tmp_path / "baseline.json"
    run = write(tmp_path / "b" / "results.json", make_results(executor="torch"))
    assert gate.main([str(run), "--baseline", str(base_path), "--update"]) == 0
    slower_machine = make_results(executor="torch")
    for summary in slower_machine["systems"].values():  # everything 40% slower: same ratios
        summary["throughput"]["output_tokens_per_s"] *= 0.6
        summary["latency"]["e2e_s"]["p50"] /= 0.6
    code, report = run_gate(tmp_path, slower_machine, base_path)
    v = verdicts(report)
    assert code == 0, v
    assert v["paged.throughput.output_tokens_per_s"] == "info"
    assert v["ratio.paged/max.throughput.output_tokens_per_s"] == "pass"
    paged_slower = make_results(executor="torch")
    paged_slower["systems"]["paged"]["throughput"]["output_tokens_per_s"] *= 0.8  # > 10% band
    code, report = run_gate(tmp_path, paged_slower, base_path)
    assert code == 1
    assert verdicts(report)["ratio.paged/max.throughput.output_tokens_per_s"] == "REGRESSION"
    within_noise = make_results(executor="torch")
    within_noise["systems"]["paged"]["throughput"]["output_tokens_per_s"] *= 0.95
    assert run_gate(tmp_path, within_noise, base_path)[0] == 0


def test_incomplete_missing_and_unknown_jobs_fail(tmp_path, baseline):
    incomplete = make_results()
    incomplete["complete"] = False
    code, report = run_gate(tmp_path, incomplete, baseline)
    assert code == 1 and verdicts(report)["run.complete"] == "INCOMPLETE"
    code, report = run_gate(tmp_path, [make_results(block_size=32), make_results()], baseline)
    assert code == 1  # (no job at all in the baseline is a usage error: test_received_files)
    assert [r["verdict"] for r in report["rows"] if r["metric"] == "(job)"] == ["NO BASELINE"]
    dropped = make_results()
    del dropped["systems"]["max"]
    code, report = run_gate(tmp_path, dropped, baseline)
    assert code == 1 and verdicts(report)["max.memory.token_states_pct"] == "MISSING"


def test_update_round_trip_rewrites_the_baseline(tmp_path, baseline):
    before = json.loads(baseline.read_text())
    assert before["pagebench_baseline"] == gate.BASELINE_FORMAT
    job = "docqa/n50/llama-2-13b/a100-80gb/bs16/seed0/sim"
    assert before["jobs"][job]["metrics"]["paged.preemptions"] == 3
    changed = make_results()
    changed["systems"]["paged"]["preemptions"] = 7
    assert run_gate(tmp_path, changed, baseline)[0] == 1
    assert run_gate(tmp_path, changed, baseline, "--update")[0] == 0
    after = json.loads(baseline.read_text())
    assert after["jobs"][job]["metrics"]["paged.preemptions"] == 7
    assert run_gate(tmp_path, changed, baseline)[0] == 0
    # the same results give the same file, byte for byte
    text = baseline.read_text()
    assert run_gate(tmp_path, changed, baseline, "--update")[0] == 0
    assert baseline.read_text() == text


def test_update_of_some_jobs_keeps_the_others_and_says_what_it_accepts(tmp_path, capsys):
    base = tmp_path / "baseline.json"
    runs = [write(tmp_path / f"r{bs}" / "results.json", make_results(block_size=bs)) for bs in (8, 16)]
    assert gate.main([*map(str, runs), "--baseline", str(base), "--update"]) == 0
    worse = make_results(block_size=16)
    worse["systems"]["paged"]["preemptions"] = 9
    capsys.readouterr()
    assert gate.main([str(write(runs[1], worse)), "--baseline", str(base), "--update",
                      "--failures-only"]) == 0
    out = capsys.readouterr().out
    assert "paged.preemptions" in out and "pass" not in out.split("gate:")[0]  # failures only
    assert "the new baseline accepts 1 failing checks" in out
    assert "kept 1 baseline jobs these results do not cover: docqa/n50/llama-2-13b/a100-80gb/bs8" in out
    jobs = json.loads(base.read_text())["jobs"]
    assert sorted(jobs) == ["docqa/n50/llama-2-13b/a100-80gb/bs16/seed0/sim",
                            "docqa/n50/llama-2-13b/a100-80gb/bs8/seed0/sim"]
    assert jobs["docqa/n50/llama-2-13b/a100-80gb/bs16/seed0/sim"]["metrics"]["paged.preemptions"] == 9


def test_an_empty_rules_file_is_an_error(tmp_path, baseline):
    rules = write(tmp_path / "rules.json", [])
    run = write(tmp_path / "r" / "results.json", make_results())
    assert gate.main([str(run), "--baseline", str(baseline), "--rules", str(rules)]) == 2


def test_update_refuses_incomplete_results(tmp_path):
    incomplete = make_results()
    incomplete["complete"] = False
    run = write(tmp_path / "r" / "results.json", incomplete)
    assert gate.main([str(run), "--baseline", str(tmp_path / "b.json"), "--update"]) == 2
    assert not (tmp_path / "b.json").exists()


def test_sweep_directory_is_searched_and_duplicate_jobs_are_refused(tmp_path, baseline, capsys):
    sweep = tmp_path / "sweep"
    write(sweep / "0" / "results.json", make_results())
    write(sweep / "0" / "previous" / "1" / "results.json", make_results())  # set aside: not read
    assert gate.main([str(sweep), "--baseline", str(baseline), "--out", str(tmp_path / "o")]) == 0
    write(sweep / "1" / "results.json", make_results())
    assert gate.main([str(sweep), "--baseline", str(baseline), "--out", str(tmp_path / "o")]) == 2
    assert "same job" in capsys.readouterr().err


def test_rules_file_round_trips_show_rules(tmp_path, baseline, capsys):
    assert gate.main(["--show-rules"]) == 0
    rules = json.loads(capsys.readouterr().out)
    assert {r["metric"] for r in rules} == {r.metric for r in gate.RULES}
    for rule in rules:  # loosen every tolerance: a 0.5-point drop now passes
        if rule["metric"] == "*.memory.token_states_pct":
            rule["abs_tol"] = 1.0
    rules_path = tmp_path / "rules.json"
    rules_path.write_text(json.dumps(rules))
    worse = make_results()
    worse["systems"]["paged"]["memory"]["token_states_pct"] -= 0.5
    assert run_gate(tmp_path, worse, baseline, "--rules", str(rules_path))[0] == 0
    rules_path.write_text(json.dumps([{"metric": "*", "better": "sideways"}]))
    assert run_gate(tmp_path, worse, baseline, "--rules", str(rules_path))[0] == 2


def test_every_gated_path_has_a_rule():
    for path in gate.SYSTEM_PATHS:
        assert gate.rule_for(f"paged.{path}", gate.RULES) is not None, path
    for path in gate.RATIO_PATHS:
        assert gate.rule_for(f"ratio.paged/max.{path}", gate.RULES).metric.startswith("ratio.")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.gate", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_bad_files_give_a_clear_error_naming_the_file(tmp_path, baseline):
    good = json.dumps(make_results())
    cases = {
        "missing.json": (None, "results file not found"),
        "truncated.json": (good[: len(good) // 2], "not valid JSON (truncated?)"),
        "old_schema.json": (json.dumps({**make_results(), "schema_version": 0}),
                            "schema_version 0 is not supported"),
        "not_results.json": (json.dumps({"hello": 1}), "not a pagebench results file"),
        "bad_systems.json": (json.dumps({**make_results(), "systems": {"paged": 3}}),
                             "field 'systems.paged'"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        proc = _cli(str(path), "--baseline", str(baseline), "--out", str(tmp_path / "o"),
                    cwd=tmp_path)
        assert proc.returncode == 2, (name, proc.stderr)
        assert str(path) in proc.stderr and message in proc.stderr, (name, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout
    good_path = write(tmp_path / "ok" / "results.json", make_results())
    for baseline_text, message in ((None, "baseline not found; create it with --update"),
                                   ('{"jobs": {}}', "not a pagebench baseline"),
                                   ('{"pagebench_baseline": 1, "jo', "not valid JSON")):
        bad = tmp_path / "bad_baseline.json"
        bad.unlink(missing_ok=True)
        if baseline_text is not None:
            bad.write_text(baseline_text)
        proc = _cli(str(good_path), "--baseline", str(bad), cwd=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr and str(bad) in proc.stderr
        assert "Traceback" not in proc.stderr
    proc = _cli(str(good_path), "--baseline", str(baseline), "--out", str(tmp_path / "o"),
                cwd=tmp_path)
    assert proc.returncode == 0 and "gate: PASS" in proc.stdout


def test_committed_smoke_baseline_is_readable_and_covers_the_smoke_sweep():
    data = gate.load_baseline(ROOT / "baselines" / "smoke.json")
    assert len(data["jobs"]) == 4
    script = (ROOT / "scripts" / "ci_gate.sh").read_text()
    for job in data["jobs"].values():
        assert job["executor"] == "sim"
        assert all(gate.rule_for(m, gate.RULES) for m in job["metrics"])
    assert "baselines/smoke.json" in script


def kernel_results(ratio: float = 1.02, frac: float = 0.5, truncated: bool = False,
                   timings: str = "cuda") -> dict:
    row = {"head_config": "llama-2-13b", "dtype": "float16", "batch": 8, "context_len": 1024,
           "block_size": 16, "paged_over_contiguous": ratio, "paged_frac_copy_bw": frac}
    device = "NVIDIA H200" if timings == "cuda" else "cpu"
    return {"schema": gate.KERNEL_SCHEMA, "timings": timings, "truncated": truncated,
            "device": {"name": device}, "rows": [row, {**row, "block_size": 32}]}


def test_kernel_results_on_cpu_are_reported_not_gated(tmp_path):
    """CPU timings of the torch reference paths move by tens of percent between runs."""
    base = tmp_path / "kernels.json"
    run = write(tmp_path / "k" / "kernel_results.json", kernel_results(timings="cpu"))
    assert gate.main([str(run), "--baseline", str(base), "--update"]) == 0
    write(run, kernel_results(ratio=1.02 * 1.5, frac=0.2, timings="cpu"))
    out = tmp_path / "out"
    assert gate.main([str(run), "--baseline", str(base), "--out", str(out)]) == 0
    v = verdicts(json.loads((out / "gate.json").read_text()))
    assert v["kernel.llama-2-13b/float16/b8/ctx1024/bs16.paged_over_contiguous"] == "info"


def test_kernel_results_are_gated_on_within_run_ratios_with_a_noise_band(tmp_path):
    base = tmp_path / "kernels.json"
    run = write(tmp_path / "k" / "kernel_results.json", kernel_results())
    assert gate.main([str(tmp_path / "k"), "--baseline", str(base), "--update"]) == 0
    point = "kernel.llama-2-13b/float16/b8/ctx1024/bs16"
    assert json.loads(base.read_text())["jobs"]["kernels/NVIDIA H200"]["metrics"][
        f"{point}.paged_over_contiguous"] == 1.02

    def gate_kernels(data: dict):
        write(run, data)
        out = tmp_path / "out"
        code = gate.main([str(run), "--baseline", str(base), "--out", str(out)])
        return code, verdicts(json.loads((out / "gate.json").read_text()))

    assert gate_kernels(kernel_results(ratio=1.02 * 1.05))[0] == 0  # inside the 10% band
    code, v = gate_kernels(kernel_results(ratio=1.02 * 1.2))
    assert code == 1 and v[f"{point}.paged_over_contiguous"] == "REGRESSION"
    code, v = gate_kernels(kernel_results(frac=0.4))
    assert code == 1 and v[f"{point}.paged_frac_copy_bw"] == "REGRESSION"
    code, v = gate_kernels(kernel_results(truncated=True))
    assert code == 1 and v["run.complete"] == "INCOMPLETE"
    write(run, {**kernel_results(), "schema": "pagebench.kernel_bench/0"})
    assert gate.main([str(run), "--baseline", str(base)]) == 2


JOB16 = "docqa/n50/llama-2-13b/a100-80gb/bs16/seed0/sim"


def test_update_refuses_to_overwrite_an_unreadable_baseline(tmp_path, capsys):
    """--update keeps a baseline's other jobs, so it must not replace one it cannot read."""
    base = tmp_path / "baseline.json"
    runs = [write(tmp_path / f"r{bs}" / "results.json", make_results(block_size=bs))
            for bs in (8, 16)]
    assert gate.main([*map(str, runs), "--baseline", str(base), "--update"]) == 0
    lines = base.read_text().splitlines(keepends=True)
    conflicted = "".join(lines[:3] + ["<<<<<<< HEAD\n"] + lines[3:])
    garbled = json.loads(base.read_text())
    garbled["jobs"][JOB16]["metrics"] = "abc"
    for text in (conflicted, json.dumps(garbled)):
        base.write_text(text)
        capsys.readouterr()
        assert gate.main([str(runs[1]), "--baseline", str(base), "--update"]) == 2
        err = capsys.readouterr().err
        assert str(base) in err and "does not overwrite" in err, err
        assert base.read_text() == text  # untouched: the bs8 job is still there
    assert gate.main([str(tmp_path / "r8"), "--baseline", str(tmp_path), "--update"]) == 2


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["jobs"][JOB16].update(metrics="abc"), f"'jobs.{JOB16}.metrics'"),
    (lambda d: d["jobs"][JOB16].pop("metrics"), f"'jobs.{JOB16}.metrics'"),
    (lambda d: d["jobs"].update({JOB16: 5}), f"'jobs.{JOB16}'"),
    (lambda d: d["jobs"].update(x=5), "'jobs.x'"),
    (lambda d: d["jobs"][JOB16]["metrics"].update({"paged.preemptions": "abc"}),
     f"'jobs.{JOB16}.metrics.paged.preemptions': must be a finite number or null"),
    (lambda d: d["jobs"][JOB16]["metrics"].update({"paged.preemptions": float("nan")}),
     "must be a finite number or null, got nan"),
    (lambda d: d["jobs"][JOB16]["metrics"].update({"paged.preemptions": True}),
     "must be a finite number or null, got True"),
], ids=["metrics-str", "metrics-missing", "job-int", "unknown-job-int", "value-str", "value-nan",
        "value-bool"])
def test_a_garbled_baseline_job_is_bad_input_not_a_verdict(tmp_path, baseline, edit, message):
    data = json.loads(baseline.read_text())
    edit(data)
    baseline.write_text(json.dumps(data))
    run = write(tmp_path / "r" / "results.json", make_results())
    proc = _cli(str(run), "--baseline", str(baseline), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(baseline) in proc.stderr and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()


def test_null_baseline_values_are_accepted(tmp_path, baseline):
    """make_baseline writes null for 'no data' (here tpot_s.p50): a figure, not bad input."""
    data = json.loads(baseline.read_text())
    assert data["jobs"][JOB16]["metrics"]["paged.latency.tpot_s.p50"] is None
    assert run_gate(tmp_path, make_results(), baseline)[0] == 0
    data["jobs"][JOB16]["metrics"]["paged.preemptions"] = None
    baseline.write_text(json.dumps(data))
    code, report = run_gate(tmp_path, make_results(), baseline)
    assert code == 1 and verdicts(report)["paged.preemptions"] == "CHANGED"


def test_a_directory_as_baseline_is_bad_input(tmp_path, capsys):
    run = write(tmp_path / "r" / "results.json", make_results())
    assert gate.main([str(run), "--baseline", str(tmp_path)]) == 2
    assert f"{tmp_path}: is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("field, bad, good", [
    ("abs_tol", "abc", 0.01), ("rel_tol", -0.1, 0), ("abs_tol", float("nan"), 1),
    ("noise_band", True, None), ("metric", 5, "*.memory.token_states_pct"), ("why", ["x"], "ok"),
])
def test_rule_fields_are_type_checked(tmp_path, baseline, capsys, field, bad, good):
    rule = {"metric": "*.memory.token_states_pct", "better": "higher"}
    rules = write(tmp_path / "rules.json", [{**rule, field: bad}])
    assert run_gate(tmp_path, make_results(), baseline, "--rules", str(rules))[0] == 2
    assert f"{rules}: field '[0].{field}'" in capsys.readouterr().err
    write(rules, [{**rule, field: good}])
    assert run_gate(tmp_path, make_results(), baseline, "--rules", str(rules))[0] == 0


def test_rules_that_match_no_metric_do_not_pass(tmp_path, baseline, capsys):
    rules = write(tmp_path / "rules.json", [{"metric": "nomatch.*", "better": "higher",
                                             "abs_tol": 0.01}])
    code, report = run_gate(tmp_path, make_results(), baseline, "--rules", str(rules))
    assert code == 2 and report is None
    assert f"{rules}: 0 checks made: no rule matches" in capsys.readouterr().err


def test_an_out_path_that_cannot_be_written_is_bad_input_not_a_regression(tmp_path, baseline,
                                                                          capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file, not a directory")
    run = write(tmp_path / "cur" / "results.json", make_results())
    assert gate.main([str(run), "--baseline", str(baseline), "--out", str(taken)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line]
    assert errors == [f"error: {taken / 'gate.json'}: cannot write it: {taken} is a file, not "
                      "a directory"]
    assert taken.read_text() == "a file, not a directory"
