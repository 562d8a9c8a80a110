"""The kernel benchmark loses nothing it measured, and measures the target points first."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():  # the first kernel test module to import triton sets the mode
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pagebench.kernels import benchmark  # noqa: E402
from pagebench.kernels.bench_plan import plan_visits  # noqa: E402
from pagebench.kernels.bench_results import POINTS_FILE, results_from_log  # noqa: E402
from pagebench.kernels.bench_spec import KernelBenchSpec, load_spec  # noqa: E402

CONFIG = Path(__file__).resolve().parent.parent / "conf" / "experiment" / "kernels.yaml"
TINY = {
    "device": "cpu", "batch_sizes": [1, 2], "context_lens": [16, 32], "block_sizes": [4, 16],
    "dtypes": ["float32"], "baselines": ["sdpa"], "cpu_repeats": 1, "copy_bytes": 1 << 16,
    "head_configs": [{"name": "g", "num_heads": 4, "num_kv_heads": 2, "head_dim": 16},
                     {"name": "m", "num_heads": 2, "num_kv_heads": 2, "head_dim": 16}],
}
KEY = ("head_config", "dtype", "batch", "context_len", "block_size")


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / POINTS_FILE).read_text().splitlines()]


def test_the_gpu_sweep_measures_target_points_first_with_both_head_configs():
    spec = KernelBenchSpec.from_mapping(load_spec(CONFIG))
    visits = plan_visits(spec)
    phases = [v.phase for v in visits]
    assert phases == sorted(phases, key=["target", "block_sweep", "rest", "repeat", "flex"].index)
    target = [v for v in visits if v.phase == "target"]
    assert target and all(v.dtype == "float16" and v.block_sizes == (16,) and v.batch >= 32
                          and v.context >= 4096 for v in target)
    # MHA and GQA alternate: a sweep cut after any two target visits has measured both
    assert [v.head.name for v in target[:2]] == ["llama-2-13b", "llama-3-8b"]
    sweep = [v for v in visits if v.phase == "block_sweep"]
    assert {v.group for v in sweep} == {v.group for v in target}
    assert all(16 not in v.block_sizes and set(v.block_sizes) == set(spec.block_sizes) - {16} for v in sweep)
    # every point of the sweep exactly once outside the flex and repeat phases
    points = [(*v.group, bs) for v in visits if v.phase not in ("flex", "repeat") for bs in v.block_sizes]
    assert len(points) == len(set(points)) == (len(spec.head_configs) * len(spec.dtypes) * len(spec.batch_sizes)
                                               * len(spec.context_lens) * len(spec.block_sizes))
    assert {(v.batch, v.context, v.block_sizes) for v in visits if v.phase == "flex"} == {(32, 4096, (16,))}
    # the stability repeat: block 16 again at every batch >= 8, after the sweep
    repeat = [(v.head.name, v.batch, v.context, v.block_sizes) for v in visits if v.phase == "repeat"]
    assert sorted(repeat) == sorted((h.name, b, c, (16,)) for h in spec.head_configs for b in spec.batch_sizes
                                    if b >= 8 for c in spec.context_lens)


def test_the_repeat_phase_times_block_16_again_and_lands_in_the_results(tmp_path):
    results = benchmark.run_kernel_benchmark({**TINY, "block_sizes": [16], "repeat_min_batch": 2}, tmp_path,
                                             progress=False)
    assert [p["name"] for p in results["phases"]] == ["rest", "repeat"]
    assert sorted((r["head_config"], r["batch"], r["context_len"]) for r in results["repeats"]) == sorted(
        (h, 2, c) for h in ("g", "m") for c in (16, 32))
    assert all(r["block_size"] == 16 and r["paged_ms"] > 0 and r["errors"] is None for r in results["repeats"])
    assert len(results["rows"]) == 8  # the repeat adds no row


def test_a_complete_run_writes_every_point_to_the_log_as_measured(tmp_path):
    results = benchmark.run_kernel_benchmark(TINY, tmp_path, progress=False)
    records = _records(tmp_path)
    assert records[0]["kind"] == "header" and records[1]["kind"] == "ceilings" and records[-1]["kind"] == "end"
    points = [r for r in records if r["kind"] == "point"]
    assert len(points) == 2 * 2 * 2 * 2 and not results["truncated"]
    assert [tuple(r[k] for k in KEY) for r in results["rows"]] == [tuple(r[k] for k in KEY) for r in points]
    assert results["read_bandwidth_GBps"] > 0 and results["copy_bandwidth_GBps"] > 0
    assert all(r["paged_frac_read_bw"] is not None for r in results["rows"])
    assert [p["name"] for p in results["phases"]] == ["rest"]  # no fp16 target points on this sweep


def test_sigint_keeps_every_measured_point_and_writes_the_summary(tmp_path, monkeypatch):
    visit = benchmark._Sweep.visit
    calls = []

    def interrupted_third_visit(self, v):
        calls.append(v)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return visit(self, v)

    monkeypatch.setattr(benchmark._Sweep, "visit", interrupted_third_visit)
    results = benchmark.run_kernel_benchmark(TINY, tmp_path, progress=False)
    assert results["truncated"] and results["truncated_reason"] == "interrupted (SIGINT)"
    measured = [(*v.group, bs) for v in calls[:2] for bs in v.block_sizes]
    assert [tuple(r[k] for k in KEY) for r in results["rows"]] == measured
    on_disk = json.loads((tmp_path / "kernel_results.json").read_text())
    assert on_disk["measured_points"] == len(measured) == 4
    assert "Truncated" in (tmp_path / "kernel_results.md").read_text()


def test_a_killed_run_is_summarised_from_its_log(tmp_path, capsys):
    benchmark.run_kernel_benchmark(TINY, tmp_path, progress=False)
    lines = (tmp_path / POINTS_FILE).read_text().splitlines()
    points = [line for line in lines if json.loads(line)["kind"] == "point"]
    # killed while writing the 6th point: no phase or end record, half a line at the end
    kept = lines[:lines.index(points[5])] + [points[5][: len(points[5]) // 2]]
    (tmp_path / POINTS_FILE).write_text("\n".join(kept))
    for name in ("kernel_results.json", "kernel_results.md", "kernel_results.csv"):
        (tmp_path / name).unlink()
    assert benchmark.main(["--summarize", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "kernel_results.json").read_text())
    assert results["truncated"] and "killed" in results["truncated_reason"]
    assert results["measured_points"] == 5 and (tmp_path / "kernel_results.md").is_file()
    assert results_from_log(tmp_path / POINTS_FILE)["rows"] == results["rows"]


def test_summarize_without_a_log_is_a_one_line_error(tmp_path, capsys):
    assert benchmark.main(["--summarize", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such point log" in err[0]


def test_plan_prints_the_measuring_order_and_estimate_without_measuring(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert benchmark.main(["--plan", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert out.index("phase target") < out.index("phase block_sweep") < out.index("phase rest") < out.index(
        "phase flex")
    assert "total estimate" in out and not list(tmp_path.iterdir())


def test_a_time_budget_stops_between_visits_and_says_so(tmp_path, monkeypatch):
    ticks = iter(range(0, 10_000, 100))  # each perf_counter() call: 100 s later
    monkeypatch.setattr(benchmark.time, "perf_counter", lambda: float(next(ticks)))
    results = benchmark.run_kernel_benchmark({**TINY, "time_budget_s": 1}, tmp_path, progress=False)
    assert results["truncated"] and "time budget" in results["truncated_reason"]
    assert results["measured_points"] < 16
