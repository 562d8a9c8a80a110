"""Calibration: the fit recovers known costs; a calibrated profile drives the simulator."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import yaml

from harness.tools.calibrate import COEFFICIENTS, Sample, fit_coefficients, main, predict
from harness.config.specs import CostSpec, FittedCostSpec, HardwareSpec, build_spec
from harness.engine.sim_executor import RooflineCostModel
from harness.errors import ConfigError
from torch_helpers import CPU, TINY, one_torch_thread  # noqa: F401

TRUE = np.array([2e-3, 3e-6, 4e-9, 5e-8, 1e-5, 2e-4])  # one value per COEFFICIENTS entry


def _samples(rng, n):
    out = []
    for _ in range(n):
        tokens = int(rng.integers(1, 4000))
        seqs = int(rng.integers(1, min(tokens, 64) + 1))
        sample = Sample((0, 0), tokens, float(rng.integers(1, 10**6)), int(rng.integers(0, 10**5)),
                        seqs, int(rng.integers(0, 4)), 0.0)
        seconds = float(np.dot(TRUE, sample.features()))
        out.append(replace(sample, seconds=seconds))
    return out


def test_fit_recovers_known_coefficients():
    samples = _samples(np.random.default_rng(0), 200)
    coef = fit_coefficients(samples)
    np.testing.assert_allclose(coef, TRUE, rtol=1e-6)
    y = np.array([s.seconds for s in samples])
    np.testing.assert_allclose(predict(coef, samples), y, rtol=1e-9)


def test_fit_never_returns_negative_coefficients():
    rng = np.random.default_rng(1)
    samples = [replace(s, seconds=s.seconds * float(rng.uniform(0.7, 1.3))) for s in _samples(rng, 80)]
    assert (fit_coefficients(samples) >= 0).all()


def _fitted(**overrides) -> FittedCostSpec:
    values = dict(zip(COEFFICIENTS, TRUE.tolist()))
    values.update(overrides)
    return FittedCostSpec(model=TINY.name, num_layers=TINY.layers, dtype=TINY.dtype,
                          compute_efficiency=0.5, bandwidth_efficiency=0.7, **values)


def test_cost_model_uses_the_fit_for_its_model_and_derived_efficiencies_otherwise():
    hardware = replace(CPU, fitted=_fitted())
    cost = RooflineCostModel(TINY, hardware, CostSpec())
    step = cost.step_cost(100, 5000.0, 2000, num_seqs=10, num_prefill_chunks=1)
    assert step.seconds == pytest.approx(float(np.dot(TRUE, [1, 100, 5000, 2000, 10, 1])))
    # fast-forwarded decode steps use the same arithmetic as single steps
    bulk = cost.decode_seconds(sum_positions=1000, num_seqs=4, span=3)
    single = [cost.step_cost(4, 1000 + 4 * k + 4, 1000 + 4 * k, num_seqs=4).seconds for k in range(3)]
    np.testing.assert_allclose(bulk, single, rtol=1e-12)
    other = replace(TINY, num_layers_override=1)
    roof = RooflineCostModel(other, hardware, CostSpec(compute_efficiency=0.9, bandwidth_efficiency=0.9))
    assert roof.fit is None
    assert roof.peak_flops == pytest.approx(CPU.peak_fp16_tflops * 1e12 * 0.5)
    assert roof.bandwidth == pytest.approx(CPU.hbm_bandwidth_gbps * 1e9 * 0.7)


def test_profile_yaml_round_trips_and_bad_coefficients_are_rejected():
    node = {"name": "x", "memory_gib": 1.0, "hbm_bandwidth_gbps": 1.0, "peak_fp16_tflops": 1.0,
            "fitted": {"model": "tiny", "num_layers": 2, "dtype": "float32", "step_overhead_s": 0.001,
                       "per_token_s": 0.0, "per_attention_pair_s": 0.0, "per_kv_read_slot_s": 0.0,
                       "per_seq_s": 0.0}}
    spec = build_spec(HardwareSpec, node, "hardware")
    assert spec.fitted.applies_to(TINY)
    with pytest.raises(ConfigError, match="hardware.fitted.per_token_s"):
        build_spec(HardwareSpec, {**node, "fitted": {**node["fitted"], "per_token_s": -1}}, "hardware")
    with pytest.raises(ConfigError, match="unknown key"):
        build_spec(HardwareSpec, {**node, "fitted": {**node["fitted"], "slope": 1}}, "hardware")


@pytest.mark.slow
def test_calibrate_cli_writes_a_usable_profile(tmp_path, capsys):
    out, report = tmp_path / "cpu-fit.yaml", tmp_path / "fit.json"
    rc = main(["--model", "tiny", "--hardware", "cpu", "--device", "cpu", "--batch-sizes", "1,3",
               "--context-lens", "8,40", "--output-len", "3", "--holdout-every", "2",
               "--out", str(out), "--json", str(report)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "CPU timings" in printed and "held-back" in printed
    text = out.read_text()
    assert "NOTE: CPU timings" in text
    assert "NOTE: fitted on contexts up to 40 tokens and batches up to 3" in text  # the rest extrapolates
    profile = build_spec(HardwareSpec, yaml.safe_load(text), "hardware")
    assert profile.name == "cpu-fit" and profile.fitted.applies_to(TINY)
    # the range measured: batches up to 3, prompts of 40 tokens and 3 outputs (KV of 42)
    assert (profile.fitted.max_batch_size, profile.fitted.max_context_len) == (3, 42)
    result = json.loads(report.read_text())
    assert result["held_back_steps"] > 0 and result["train_steps"] > 0
    assert result["held_back_error"]["count"] == result["held_back_steps"]
    assert sum(p["held_back"] for p in result["points"]) == 2
    # the simulator now predicts with the fitted coefficients
    cost = RooflineCostModel(TINY, profile, CostSpec())
    assert cost.fit is profile.fitted


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "a,b"], "argument --batch-sizes: not an integer: 'a'"),
    (["--context-lens", "0"], "argument --context-lens: must be >= 1, got 0"),
    (["--holdout-every", "1"], "--holdout-every must be >= 2"),
    (["--out", "/dev/null/x.yaml"], "argument --out: cannot write /dev/null/x.yaml"),
])
def test_bad_arguments_fail_before_anything_is_measured(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--model", "tiny", "--hardware", "cpu", "--device", "cpu", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_an_existing_profile_is_not_replaced_without_force(tmp_path, capsys):
    out = tmp_path / "cpu.yaml"
    out.write_text("kept\n")
    assert main(["--model", "tiny", "--hardware", "cpu", "--device", "cpu", "--out", str(out)]) == 2
    assert "exists (a shipped or earlier profile): pass --force" in capsys.readouterr().err
    assert out.read_text() == "kept\n"


def test_the_fit_recovers_the_linear_layers_roofline_max():
    # seconds = TRUE's terms with the token term max(per_token * tokens, floor): a knee at
    # 1,000 tokens (a sample has exactly 1,000, so the knee search can land on it)
    from harness.tools.calibrate_fit import fit_coefficients as fit

    floor = TRUE[1] * 1000
    rng = np.random.default_rng(3)
    samples = []
    for s in _samples(rng, 200) + [replace(_samples(rng, 1)[0], num_tokens=1000)]:
        features = s.features()
        seconds = float(np.dot(TRUE, features) - TRUE[1] * features[1]
                        + max(TRUE[1] * features[1], floor))
        samples.append(replace(s, seconds=seconds))
    coef = fit(samples, with_floor=True)
    np.testing.assert_allclose(coef, [*TRUE, floor], rtol=1e-6)
    np.testing.assert_allclose(predict(coef, samples), [s.seconds for s in samples], rtol=1e-9)
    assert fit(samples)[1] != pytest.approx(TRUE[1], rel=1e-3)  # a linear fit cannot


def test_contiguous_systems_use_their_own_fit_and_spans_match_single_steps_with_a_floor():
    from harness.config.specs import SystemSpec
    from harness.engine.executors import make_cost_model

    paged_fit, contiguous_fit = _fitted(linear_floor_s=0.05), _fitted(per_seq_s=1e-3)
    hardware = replace(CPU, fitted=paged_fit, fitted_contiguous=contiguous_fit)
    oracle = SystemSpec(name="oracle", kind="contiguous", policy="oracle")
    paged = SystemSpec(name="paged", kind="paged", block_size=16)
    for system, fit in ((oracle, contiguous_fit), (paged, paged_fit)):
        for model in ("roofline", "operator"):  # a fit of the run's model wins under either
            assert make_cost_model(CostSpec(model=model), system, TINY, hardware).fit == fit
    cost = make_cost_model(CostSpec(), paged, TINY, hardware)
    bulk = cost.decode_seconds(sum_positions=1000, num_seqs=4, span=40)  # the numpy path
    single = [cost.step_cost(4, 1000 + 4 * k + 4, 1000 + 4 * k, num_seqs=4).seconds
              for k in range(40)]
    assert bulk == single and bulk[0] >= 0.05


def test_a_point_takes_its_layouts_reservation_not_the_paged_blocks():
    # 140 tokens: 9 blocks of 16 = 144 slots paged; the oracle's buddy extent is 256 (the
    # GPU run's (1, 128) point with 12 outputs sized 144 + 4 blocks = 208 and was rejected)
    from harness.tools.calibrate import point_slots
    from torch_helpers import engine

    assert point_slots(TINY, engine(), "paged", 16, 3, 128, 12) == 3 * 144
    assert point_slots(TINY, engine(), "contiguous", 16, 3, 128, 12) == 3 * 256


@pytest.mark.slow
def test_contiguous_calibration_runs_where_the_paged_sizing_rejected_it():
    # the GPU failure on CPU: `grid point (1, 128) rejected requests: {'larger_than_pool': 1}`
    from harness.tools.calibrate import calibrate
    from torch_helpers import engine

    lines: list[str] = []
    result = calibrate(TINY, CPU, engine(kv_capacity_slots=None), batch_sizes=(1, 2),
                       context_lens=(128,), output_len=12, holdout_every=2, layout="contiguous",
                       log=lines.append)
    assert [(p["batch_size"], p["steps"]) for p in result["points"]] == [(1, 12), (2, 12)]
    assert result["held_back_error"]["count"] == 12  # the held-back point's 12 steps
    assert result["warmup_wall_s"] > 0 and any("warm-up passes (untimed" in line for line in lines)
