"""python -m harness.tools.calibrate_runs: h200's measured defaults, recomputed from the
committed files they cite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from harness.tools.calibrate_runs import (fit_compute_and_host, linear_bandwidth_efficiency, main,
                                          prepare_inputs_cost)

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "benchmarks" / "gpu" / "2026-12-04-h200"
KERNELS = H200 / "call1" / "kernels" / "kernel_results.json"
HOSTCOST = H200 / "call2" / "hostcost.json"


def test_linear_efficiency_is_the_benchmarks_median_over_batches_against_the_spec():
    data = json.loads(KERNELS.read_text())
    first = {}
    for r in data["rows"]:
        if r["head_config"] == "llama-2-13b" and r.get("linear_ms"):
            first.setdefault(r["batch"], r["linear_roofline_ms"] / r["linear_ms"])
    got = linear_bandwidth_efficiency(data, "llama-2-13b", 4800.0)
    assert got["batches"] == [1, 8, 32, 64]
    expected = float(np.median(list(first.values()))) * data["copy_bandwidth_GBps"] / 4800.0
    assert got["efficiency"] == pytest.approx(expected, abs=1e-4)


def test_prepare_inputs_is_a_line_through_the_host_cost_rows():
    rows = [{"batch_size": 1, "mode": "full", "ms_per_step": 0.2},
            {"batch_size": 3, "mode": "full", "ms_per_step": 0.4},
            {"batch_size": 3, "mode": "resident", "ms_per_step": 9.0}]
    got = prepare_inputs_cost({"rows": rows}, resident=False)
    assert got["per_step_s"] == pytest.approx(1e-4) and got["per_seq_s"] == pytest.approx(1e-4)


def test_the_fit_recovers_known_compute_efficiency_and_host_rest():
    rng = np.random.default_rng(0)
    n = 60
    prefill = rng.random(n) < 0.3
    tokens = np.where(prefill, rng.integers(500, 8000, n), rng.integers(1, 100, n))
    seqs = np.where(prefill, rng.integers(1, 10, n), tokens)
    sim = pd.DataFrame({"attention_prefill_s": np.where(prefill, tokens * 2e-7, 0.0),
                        "attention_decode_s": np.where(prefill, 0.0, seqs * 1e-4),
                        "kv_write_s": tokens * 1e-7, "copy_s": 0.0, "swap_s": 0.0})
    token_s, weights_s, prep = 3e-5, 7e-3, {"per_step_s": 1e-4, "per_seq_s": 1e-5}
    ce, rest, rest_seq = 0.45, 8e-4, 6e-5
    seconds = (np.maximum(tokens * token_s / ce, weights_s) + sim["attention_prefill_s"] / ce
               + sim["attention_decode_s"] + sim["kv_write_s"] + prep["per_step_s"]
               + prep["per_seq_s"] * seqs + rest + rest_seq * seqs)
    measured = pd.DataFrame({"duration_s": seconds, "num_batched_tokens": tokens, "num_seqs": seqs,
                             "num_prefill_tokens": np.where(prefill, tokens, 0)})
    got = fit_compute_and_host(measured, sim, token_s, weights_s, prep)
    assert got["compute_efficiency"] == pytest.approx(ce, abs=1e-4)
    assert got["rest_per_step_s"] == pytest.approx(rest, abs=2e-6)
    assert got["rest_per_seq_s"] == pytest.approx(rest_seq, abs=2e-7)
    assert got["slow_steps_left_out"] == [] and got["error"]["median_abs_pct"] < 0.01


def test_h200_yaml_holds_what_the_tool_fits_on_the_files_it_cites(tmp_path):
    out = tmp_path / "fit.json"
    assert main([str(H200 / "call2" / "docqa"), "--system", "paged", "--hostcost", str(HOSTCOST),
                 "--kernel-results", str(KERNELS), "--json", str(out)]) == 0
    fit = json.loads(out.read_text())
    hardware = yaml.safe_load((ROOT / "conf" / "hardware" / "h200.yaml").read_text())
    host = yaml.safe_load((ROOT / "conf" / "host_profile" / "pagebench_torch_h200.yaml").read_text())
    assert hardware["bandwidth_efficiency"] == fit["linear_bandwidth"]["efficiency"]
    assert hardware["compute_efficiency"] == fit["fit"]["compute_efficiency"]
    assert host["components"]["prepare_inputs"] == {k: fit["prepare_inputs"][k] for k in ("per_step_s", "per_seq_s")}
    assert host["components"]["rest"] == {"per_step_s": fit["fit"]["rest_per_step_s"],
                                          "per_seq_s": fit["fit"]["rest_per_seq_s"]}
    assert fit["fit"]["slow_steps_left_out"] == [1, 5]


def test_the_h200_kernel_profile_is_the_committed_kernel_results_as_a_table(tmp_path):
    from harness.engine.cost_profiles import _points_from_kernel_results, load_kernel_profile
    from harness.tools.calibrate_runs import kernel_profile_yaml

    shipped = load_kernel_profile("h200_event_timed")
    assert shipped.points == _points_from_kernel_results(KERNELS)  # bit for bit
    rewritten = kernel_profile_yaml(KERNELS, "h200_event_timed",
                                    "benchmarks/gpu/2026-12-04-h200/call1/kernels/kernel_results.json")
    assert rewritten == (ROOT / "conf" / "kernel_profile" / "h200_event_timed.yaml").read_text()
