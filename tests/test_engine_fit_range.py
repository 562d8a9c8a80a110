"""A simulated run on a calibrated profile says how many steps it priced beyond the fit's range."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, strategies as st
from omegaconf import OmegaConf

from harness.config.specs import HardwareSpec, build_spec
from harness.engine.fit_range import FitRange, covering_grid, extrapolation_warnings
from harness.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_a_step_is_beyond_when_its_batch_or_its_mean_kv_per_sequence_is():
    fit = FitRange(max_batch_size=4, max_context_len=100)
    fit.step(4, 400)  # 4 sequences of 100 slots on average: inside
    fit.step(5, 100)  # one sequence too many
    fit.step(2, 201)  # 100.5 slots on average
    fit.step(0, 0)  # swaps only: not priced by the fit
    assert fit.report() == {"fitted_max_batch_size": 4, "fitted_max_context_len": 100,
                            "largest_batch": 5, "largest_mean_context": 100.5,
                            "steps_priced": 3, "steps_beyond_fit": 2}


@given(limit_batch=st.integers(1, 8), limit_context=st.integers(1, 300),
       num_seqs=st.integers(1, 10), sum_positions=st.integers(0, 3000), span=st.integers(0, 40))
def test_a_decode_span_counts_exactly_as_its_steps_one_by_one(limit_batch, limit_context, num_seqs,
                                                               sum_positions, span):
    bulk, single = FitRange(limit_batch, limit_context), FitRange(limit_batch, limit_context)
    bulk.decode_span(sum_positions, num_seqs, span)
    for i in range(span):  # step i reads sum_positions + num_seqs * i slots and writes num_seqs
        single.step(num_seqs, sum_positions + num_seqs * i + num_seqs)
    assert bulk.report() == single.report()


def test_a_profile_range_must_be_positive_integers():
    node = {"name": "x", "memory_gib": 1.0, "hbm_bandwidth_gbps": 1.0, "peak_fp16_tflops": 1.0,
            "fitted": {"model": "tiny", "num_layers": 2, "dtype": "float32", "step_overhead_s": 0.001,
                       "per_token_s": 0.0, "per_attention_pair_s": 0.0, "per_kv_read_slot_s": 0.0,
                       "per_seq_s": 0.0, "max_batch_size": 16, "max_context_len": 197}}
    assert build_spec(HardwareSpec, node, "hardware").fitted.max_context_len == 197
    for bad in (0, -3, 2.5, True, "16"):
        with pytest.raises(ConfigError, match="hardware.fitted.max_batch_size: must be a positive"):
            build_spec(HardwareSpec, {**node, "fitted": {**node["fitted"], "max_batch_size": bad}},
                       "hardware")
    # a profile written before the range was recorded still loads (and tallies nothing)
    old = {k: v for k, v in node["fitted"].items() if not k.startswith("max_")}
    assert build_spec(HardwareSpec, {**node, "fitted": old}, "hardware").fitted.max_batch_size is None


def _calibrated_run(out_dir: Path, *overrides: str, fitted: dict | None) -> dict:
    """A docqa run of the tiny model on the CPU profile, calibrated as ``fitted`` says."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.run.serve import run_serving

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=tiny", "hardware=cpu", "workload=docqa", "workload.num_requests=30",
            "workload.arrival.rate=20", "engine.kv_capacity_slots=20000", "report=false",
            "progress=false", "jobs=1", *overrides])
    GlobalHydra.instance().clear()
    if fitted is not None:
        OmegaConf.update(cfg, "hardware.fitted", {
            "model": "tiny", "num_layers": 2, "dtype": "float32", "step_overhead_s": 0.002,
            "per_token_s": 1e-5, "per_attention_pair_s": 1e-9, "per_kv_read_slot_s": 1e-8,
            "per_seq_s": 1e-5, **fitted}, force_add=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    return run_serving(cfg, out_dir)


def test_a_run_beyond_the_fit_says_so_in_results_and_on_the_console(tmp_path, capsys):
    results = _calibrated_run(tmp_path / "narrow", fitted={"max_batch_size": 4,
                                                           "max_context_len": 100_000})
    written = json.loads((tmp_path / "narrow" / "results.json").read_text())
    assert written["warnings"] == results["warnings"]
    printed = capsys.readouterr().err
    [line] = results["warnings"]
    assert line.startswith("simulated steps beyond the range hardware=cpu was calibrated on "
                           "(batches up to 4, 100,000 KV tokens per sequence)") and line in printed
    for name, summary in results["systems"].items():
        fit = summary["fit_range"]
        assert fit["fitted_max_batch_size"] == 4 and fit["fitted_max_context_len"] == 100_000
        assert fit["steps_priced"] == summary["steps"] > fit["steps_beyond_fit"]
        # beyond = batches above 4 (no context comes near 100K): max reservation runs at
        # most 4 sequences in this pool (20,000 slots / 4,096), the others more
        assert (fit["steps_beyond_fit"] > 0) == (fit["largest_batch"] > 4)
        counted = f"{name} {fit['steps_beyond_fit']:,} of {fit['steps_priced']:,} ("
        assert (counted in line) == (fit["steps_beyond_fit"] > 0)
    assert results["systems"]["paged"]["fit_range"]["steps_beyond_fit"]
    assert not results["systems"]["max"]["fit_range"]["steps_beyond_fit"]
    assert extrapolation_warnings(results["systems"], "cpu") == results["warnings"]
    # the command it suggests calibrates on a grid reaching what the run reached
    reached = [s["fit_range"] for s in results["systems"].values()]
    grid = re.search(r"--batch-sizes ([\d,]+) --context-lens ([\d,]+) --name cpu --force", line)
    batches, contexts = ([int(v) for v in g.split(",")] for g in grid.groups())
    assert batches[0] == 1 and batches[-1] == max(f["largest_batch"] for f in reached)
    assert contexts[0] == 16 and 0 <= contexts[-1] - max(f["largest_mean_context"] for f in reached) < 16


def test_a_covering_grid_grows_by_four_up_to_the_largest_value_rounded_up():
    assert covering_grid(200, 1) == [1, 4, 16, 64, 200]
    assert covering_grid(4, 1) == [1, 4]
    assert covering_grid(1, 1) == [1]
    assert covering_grid(3115, 16, align=16) == [16, 64, 256, 1024, 3120]
    assert covering_grid(10, 16, align=16) == [16]


def test_fast_forward_tallies_the_same_steps_as_the_step_loop(tmp_path, monkeypatch):
    spans = []
    decode_span = FitRange.decode_span
    monkeypatch.setattr(FitRange, "decode_span",
                        lambda self, *args: (spans.append(args), decode_span(self, *args)))
    fitted = {"max_batch_size": 6, "max_context_len": 1500}
    bulk = _calibrated_run(tmp_path / "bulk", fitted=fitted)
    assert spans, "no span was fast-forwarded: the test compares nothing"
    spans.clear()
    loop = _calibrated_run(tmp_path / "loop", "engine.fast_forward=false", fitted=fitted)
    assert not spans
    for name in bulk["systems"]:
        assert bulk["systems"][name]["fit_range"] == loop["systems"][name]["fit_range"]
    assert any(s["fit_range"]["steps_beyond_fit"] for s in bulk["systems"].values())


def test_a_run_inside_the_fit_or_without_one_warns_of_nothing(tmp_path):
    wide = _calibrated_run(tmp_path / "wide", fitted={"max_batch_size": 1000,
                                                       "max_context_len": 100_000})
    assert "warnings" not in wide
    assert all(s["fit_range"]["steps_beyond_fit"] == 0 for s in wide["systems"].values())
    plain = _calibrated_run(tmp_path / "plain", fitted=None)  # the roofline: nothing to tally
    assert all("fit_range" not in s for s in plain["systems"].values())

