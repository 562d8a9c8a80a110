"""The kernel benchmark on a tiny CPU sweep, its Hydra config, and its figures."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():  # the first kernel test module to import triton sets the mode
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from pagebench.kernels.benchmark import KernelBenchSpec, main, run_kernel_benchmark  # noqa: E402
from pagebench.reports.kernel_figures import kernel_figures  # noqa: E402

CONFIG = Path(__file__).resolve().parent.parent / "conf" / "experiment" / "kernels.yaml"

TINY = {
    "device": "cpu",
    "batch_sizes": [1, 3],
    "context_lens": [17, 64],
    "block_sizes": [4, 16],
    "dtypes": ["float32"],
    "head_configs": [
        {"name": "tiny-gqa", "num_heads": 4, "num_kv_heads": 2, "head_dim": 32,
         "hidden_size": 128, "intermediate_size": 256, "num_layers": 2},
        {"name": "tiny-mha", "num_heads": 2, "num_kv_heads": 2, "head_dim": 80},  # no model dims: no e2e
    ],
    "baselines": ["reference", "sdpa"],
    "cpu_repeats": 2,
    "copy_bytes": 1 << 20,
}


def _strict_json(path: Path) -> dict:
    def no_constants(name):
        raise ValueError(f"non-JSON constant {name}")

    return json.loads(path.read_text(), parse_constant=no_constants)


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("kernel_bench")
    return run_kernel_benchmark(TINY, out, progress=False), out


def test_cpu_benchmark_writes_valid_json_csv_and_markdown(tiny_results):
    results, out = tiny_results
    on_disk = _strict_json(out / "kernel_results.json")
    assert on_disk["timings"] == "cpu"
    assert on_disk["schema"] == "pagebench.kernel_bench/1"
    assert "CPU timings" in on_disk["method"]["timing"]
    assert on_disk["copy_bandwidth_GBps"] > 0
    rows = on_disk["rows"]
    assert len(rows) == 2 * 2 * 2 * 2  # heads x batches x contexts x block sizes
    for row in rows:
        assert row["errors"] is None, row["errors"]
        for key in ("paged_ms", "contiguous_ms", "reference_ms", "sdpa_ms"):
            assert row[key] is not None and row[key] > 0 and math.isfinite(row[key])
        assert row["flex_ms"] is None  # not requested
        expected_bytes = 4 * (2 * row["batch"] * row["context_len"] * row["num_kv_heads"] * row["head_dim"]
                              + 2 * row["batch"] * row["num_heads"] * row["head_dim"])
        assert row["bytes"] == expected_bytes
        assert row["paged_GBps"] == pytest.approx(row["bytes"] / (row["paged_ms"] * 1e-3) / 1e9)
        assert row["paged_over_contiguous"] == pytest.approx(row["paged_ms"] / row["contiguous_ms"])
        assert row["paged_vs_sdpa_max_abs"] < 1e-4 and row["contiguous_vs_sdpa_max_abs"] < 1e-4
        if row["head_config"] == "tiny-gqa":
            assert row["step_ms"] == pytest.approx(2 * (row["paged_ms"] + row["linear_ms"]))
            assert row["indirection_share"] is not None
        else:
            assert row["indirection_share"] is None
    with open(out / "kernel_results.csv") as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    md = (out / "kernel_results.md").read_text()
    assert "cpu timings" in md and "| tiny-gqa |" in md
    assert results["targets"] is None  # H200 targets are only evaluated on CUDA timings


def test_kernel_figures_have_labelled_axes_and_legends(tiny_results):
    results, _ = tiny_results
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figures = kernel_figures(results)
    assert len(figures) == 3 and all(isinstance(f, Figure) for f, _ in figures)
    for fig, caption in figures:
        assert len(fig.axes) == 2  # one per head config
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_ylabel()
            assert "(" in ax.get_ylabel()  # units
        assert "CPU timings" in fig.get_suptitle()
        # one legend for the figure, beside its panels: it covers no line
        FigureCanvasAgg(fig).draw()
        assert len(fig.legends) == 1
        legend = fig.legends[0].get_window_extent()
        assert not any(legend.overlaps(ax.get_window_extent()) for ax in fig.axes)
        # the CPU timed torch's reference paths, not the Triton kernel: the caption says so
        assert "torch's reference paths" in caption and "not the Triton kernels" in caption


def test_kernel_figures_tolerate_missing_values():
    results = {"timings": "cuda", "device": {"name": "test"}, "copy_bandwidth_GBps": 100.0, "rows": [
        {"head_config": "h", "dtype": "float16", "batch": 1, "context_len": 64, "block_size": 16,
         "paged_ms": None, "contiguous_ms": 1.0, "sdpa_ms": None, "paged_GBps": None,
         "contiguous_GBps": 2.0, "paged_over_contiguous": None},
    ]}
    assert len(kernel_figures(results)) == 3
    assert len(kernel_figures({"rows": []})) == 3


def test_hydra_experiment_config_is_a_valid_spec_with_a_small_cpu_default():
    text = CONFIG.read_text()
    assert text.startswith("# @package _global_")
    cfg = OmegaConf.load(CONFIG)
    assert cfg.run == "kernels"
    spec = KernelBenchSpec.from_mapping(cfg.kernel_bench)
    assert {h.name for h in spec.head_configs} >= {"llama-2-13b", "llama-3-8b"}
    assert 16 in spec.block_sizes
    cpu = spec.for_device(torch.device("cpu"))
    assert max(cpu.batch_sizes) * max(cpu.context_lens) <= 4096  # small enough for CI machines
    assert "flex" not in cpu.baselines


@pytest.mark.parametrize("change,match", [
    ({"block_sizes": [12]}, "powers of two"),
    ({"dtypes": ["float8"]}, "dtypes"),
    ({"batch_sizes": []}, "batch_sizes"),
    ({"bogus": 1}, "unknown key"),
    ({"head_configs": [{"name": "x", "num_heads": 3, "num_kv_heads": 2, "head_dim": 64}]}, "multiple"),
    ({"baselines": ["vllm"]}, "baselines"),
])
def test_spec_errors_say_what_to_fix(change, match):
    with pytest.raises(ValueError, match=match):
        KernelBenchSpec.from_mapping({**TINY, **change})


def test_cli_runs_the_cpu_default_with_overrides(tmp_path, capsys):
    rc = main(["--device", "cpu", "--out", str(tmp_path), "--quiet", "--set", "batch_sizes=[2]",
               "--set", "context_lens=[32]", "--set", "block_sizes=[8]", "--set", "cpu_repeats=1"])
    assert rc == 0
    results = _strict_json(tmp_path / "kernel_results.json")
    assert [(r["batch"], r["context_len"], r["block_size"]) for r in results["rows"]] == [(2, 32, 8)]
    assert "cpu timings" in capsys.readouterr().out


def test_sizes_set_through_hydra_win_over_the_cpu_defaults_too(tmp_path):
    """``python -m harness experiment=kernels kernel_bench.batch_sizes=[2]`` runs batch 2 on
    a CPU, as ``--set`` does (the experiment's ``cpu`` node holds smaller defaults). No
    report: none is read here (tests/test_report.py renders the kernels section)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "harness", "experiment=kernels", "kernel_bench.batch_sizes=[2]",
         "kernel_bench.context_lens=[32]", "kernel_bench.block_sizes=[8]",
         "kernel_bench.cpu_repeats=1", "report=false", f"hydra.run.dir={tmp_path}"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = _strict_json(tmp_path / "kernel_results.json")
    assert [(r["batch"], r["context_len"], r["block_size"]) for r in results["rows"]] == [(2, 32, 8)]
    assert f"kernel_results.json: {tmp_path / 'kernel_results.json'}" in proc.stderr  # the summary
