"""The per-operator cost model: a hand-computed step, monotonicity, the kernel profiles'
interpolation and range, bad profiles, and a round trip from a CPU kernel benchmark."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine_helpers import HARDWARE, MODEL
from harness.config.specs import CostSpec, ModelSpec
from harness.engine.cost_operator import OperatorCostModel
from harness.engine.cost_profiles import load_kernel_profile
from harness.engine.fit_range import kernel_range_warnings
from harness.engine.plan import ScheduledChunk, StepPlan
from harness.engine.sim_executor import SimExecutor
from harness.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

SMALL = str(Path(__file__).parent / "data" / "kernel_results_small.json")


@pytest.fixture
def host(tmp_path) -> str:
    path = tmp_path / "host.yaml"
    path.write_text("name: test\ncomponents:\n  a: {per_step_s: 0.001, per_seq_s: 0.0001}\n"
                    "  b: {per_step_s: 0.0005, per_seq_s: 0.0}\n")
    return str(path)


def _executor(profile: str, block_size: int | None, host: str, layout: str = "paged",
              results: str | None = None, model: ModelSpec = MODEL) -> SimExecutor:
    cost = CostSpec(kernel_profile=profile, host_profile=host, kernel_results=results)
    return SimExecutor(OperatorCostModel(model, HARDWARE, cost, layout, block_size), block_size or 1)


def _decode_plan(starts: list[int]) -> StepPlan:
    plan = StepPlan()
    plan.add_decodes([None] * len(starts), list(starts))
    return plan


def test_a_mixed_step_costs_what_the_formulas_give_by_hand(host):
    # MODEL: 2 layers, hidden 64, 4 heads of 16 (MHA), MLP 128 (gated), vocab 1000, fp16.
    # params = 2 * (64*(4+8)*16 + 4*16*64 + 3*64*128) + 2*1000*64 = 209,920 -> 419,840 bytes;
    # linear FLOPs per token 2 * (209,920 - 64,000) = 291,840; KV slot 2*2*4*16*2 = 512 bytes.
    # HARDWARE: 10 TFLOPS x 0.6, 100 GB/s (x 0.8 for weights, writes).
    executor = _executor("fa_sm100_pr2104_before", 16, host)
    plan = _decode_plan([10, 20, 30])  # three decodes reading 11 + 21 + 31 = 63 slots
    prompt = SimpleNamespace(seq_id=9, num_tokens=5, num_generated=0)
    plan.add_chunk(ScheduledChunk(prompt, 0, 5))  # a 5-token prompt: 1+2+3+4+5 = 15 pairs
    seconds, _ = executor.execute(plan)
    linear = max(8 * 291_840 / 6e12, 419_840 / 8e10)
    prefill = 15 * 4 * 2 * 4 * 16 / 6e12
    # block 16 between the PR's pages 8 (3,901.7 GB/s) and 32 (4,372.9): log-linear midpoint,
    # of the B200's 8,000 GB/s; the decode batch is 3 sequences
    efficiency = (3901.7 + 4372.9) / 2 / 8000
    decode = 63 * 512 / (100e9 * efficiency)
    write = 8 * 512 / 8e10
    host_s = 0.0015 + 4 * 0.0001
    assert seconds == pytest.approx(linear + prefill + decode + write + host_s, rel=1e-12)
    row = {name: values[0] for name, values in executor.phase_columns().items()}
    assert row["attention_decode_s"] == pytest.approx(decode, rel=1e-12)
    assert row["attention_prefill_s"] == pytest.approx(prefill, rel=1e-12)
    assert row["host_s"] == pytest.approx(host_s, rel=1e-12)


def test_more_kv_read_never_takes_less_time(host):
    for profile, results in (("ideal", None), ("fa_sm100_pr2104_before", None), ("measured", SMALL)):
        executor = _executor(profile, 4, host, results=results)
        times = [executor.execute(_decode_plan([context] * batch))[0]
                 for batch in (1, 3, 8, 12) for context in (10, 60, 300, 700)]
        by_batch = [times[i:i + 4] for i in range(0, 16, 4)]
        assert all(a <= b for row in by_batch for a, b in zip(row, row[1:])), profile


def test_a_profile_penalising_small_blocks_makes_block_1_slower_than_16(host):
    plan = [100] * 8  # the same KV (equal memory) read through either block size
    small = _executor("fa_sm100_pr2104_before", 1, host).execute(_decode_plan(plan))[0]
    large = _executor("fa_sm100_pr2104_before", 16, host).execute(_decode_plan(plan))[0]
    flat_1 = _executor("ideal", 1, host).execute(_decode_plan(plan))[0]
    flat_16 = _executor("ideal", 16, host).execute(_decode_plan(plan))[0]
    assert small > large and flat_1 == flat_16


def test_measured_profile_is_bilinear_inside_and_counts_steps_beyond(host):
    # tests/data/kernel_results_small.json: batches 1, 8; contexts 64, 512; blocks 1, 4, 16;
    # block 4 (bit_length 3): 0.6 + 0.05 at batch 8 + 0.02 at context 512
    executor = _executor("measured", 4, host, results=SMALL)
    efficiency = executor.cost_model.efficiency
    assert efficiency(1, 64) == pytest.approx(0.6)
    assert efficiency(8, 512) == pytest.approx(0.67)
    assert efficiency(4.5, 288) == pytest.approx(0.6 + 0.025 + 0.01)  # the middle of the cell
    assert efficiency(20, 5000) == pytest.approx(0.67)  # held at the edge
    # block 8 lies between 4 and 16: log-linear, halfway (0.6 and 0.8 at batch 1, context 64)
    between = _executor("measured", 8, host, results=SMALL).cost_model.efficiency
    assert between(1, 64) == pytest.approx(0.7)
    executor.execute(_decode_plan([100, 100]))  # batch 2, context 101: inside
    executor.execute(_decode_plan([2000] * 3))  # context 2,001: beyond
    report = executor.cost_report()["kernel_range"]
    assert (report["steps_priced"], report["steps_beyond_profile"]) == (2, 1)
    (line,) = kernel_range_warnings({"paged": {"cost_model": executor.cost_report()}})
    assert "paged 1 of 2 (50%)" in line and "batches 1-8" in line and "64-512" in line


def test_a_block_size_outside_the_measured_ones_uses_the_nearest_and_says_so(host):
    report = _executor("measured", 64, host, results=SMALL).cost_report()["kernel_range"]
    assert "block 16's efficiency is used" in report["note"]


def _write_results(tmp_path, mutate) -> str:
    data = json.loads(Path(SMALL).read_text())
    mutate(data["rows"])
    path = tmp_path / "kernel_results.json"
    path.write_text(json.dumps(data))  # NaN is written as JSON's NaN extension
    return str(path)


@pytest.mark.parametrize("mutate, match", [
    (lambda rows: rows[2].update(paged_frac_copy_bw=math.nan), r"rows\[2\]\.paged_frac_copy_bw"),
    (lambda rows: rows[1].pop("context_len"), r"rows\[1\]\.context_len"),
    (lambda rows: rows[0].update(paged_ms=-1.0), r"rows\[0\]\.paged_ms"),
    (lambda rows: rows.clear(), r"rows: missing or empty"),
])
def test_a_malformed_kernel_results_file_names_the_file_and_field(tmp_path, host, mutate, match):
    path = _write_results(tmp_path, mutate)
    load_kernel_profile.cache_clear()
    with pytest.raises(ConfigError, match=match) as error:
        _executor("measured", 16, host, results=path)
    assert path in str(error.value) and "\n" not in str(error.value)


def test_a_profile_lacking_the_head_config_or_layout_names_the_nearest_points(tmp_path, host):
    gqa = ModelSpec(name="g", num_layers=2, hidden_size=64, num_heads=8, num_kv_heads=2,
                    head_dim=32, intermediate_size=128, vocab_size=1000, max_context=4096)
    with pytest.raises(ConfigError, match=r"GQA group 4, head_dim 32.*nearest measured: group 1 "
                                          r"head_dim 16 float16"):
        _executor("measured", 16, host, results=SMALL, model=gqa)
    only_paged = tmp_path / "paged_only.yaml"
    only_paged.write_text("points:\n  - {layout: paged, efficiency: 0.5}\n")
    with pytest.raises(ConfigError, match="has no contiguous points"):
        _executor(str(only_paged), None, host, layout="contiguous")


def test_a_cpu_kernel_benchmark_round_trips_into_a_measured_profile(tmp_path, host):
    from pagebench.kernels.benchmark import run_kernel_benchmark

    spec = {"device": "cpu", "batch_sizes": [1, 2], "context_lens": [16, 32], "block_sizes": [4],
            "dtypes": ["float32"], "baselines": [], "cpu_repeats": 1, "copy_bytes": 1 << 16,
            "head_configs": [{"name": "tiny", "num_heads": 4, "num_kv_heads": 2, "head_dim": 16}]}
    results = run_kernel_benchmark(spec, tmp_path, progress=False)
    model = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                      head_dim=16, intermediate_size=128, vocab_size=100, max_context=256,
                      dtype="float32")
    paged = _executor("measured", 4, host, results=str(tmp_path / "kernel_results.json"), model=model)
    contiguous = _executor("measured", None, host, layout="contiguous",
                           results=str(tmp_path / "kernel_results.json"), model=model)
    for row in results["rows"]:
        at = (row["batch"], row["context_len"])
        assert paged.cost_model.efficiency(*at) == pytest.approx(row["paged_frac_copy_bw"])
        assert contiguous.cost_model.efficiency(*at) == pytest.approx(row["contiguous_frac_copy_bw"])


def test_a_profile_that_declares_nearest_head_configs_prices_an_unmeasured_one_with_a_note():
    """head_configs: nearest (h200's default profile): GQA group 8 in bfloat16 takes the
    measured group 4 float16 points (nearest on a log2 scale, the same 16-bit bytes), not
    group 1, and the note says which stood in; an exact profile still refuses (above)."""
    from harness.engine.cost_profiles import decode_efficiency

    profile = load_kernel_profile("h200_event_timed")
    assert profile.head_configs == "nearest"
    group4 = decode_efficiency(profile, "paged", 16, 4, 128, "float16")
    group8 = decode_efficiency(profile, "paged", 16, 8, 128, "bfloat16")
    assert group8(64, 6000) == group4(64, 6000)
    assert "group 4, head_dim 128, float16" in group8.note and group4.note is None
    group2 = decode_efficiency(profile, "contiguous", None, 2, 256, "bfloat16")  # gemma-2-9b
    assert "(group 1, head_dim 128, float16)" in group2.note  # |log2 2 - log2 1| = |log2 2 - log2 4|: the lower


@pytest.mark.parametrize("model", sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")
                                         if p.stem not in ("hf", "deepseek-v3")))
def test_every_model_preset_runs_on_h200_with_its_defaults(model):
    """hardware=h200 with no other key builds every model preset's executor (deepseek-v3 needs
    16 GPUs, more than an NVLink domain, and is refused naming them: test_tensor_parallel)."""
    from hydra import compose, initialize_config_dir

    from harness.run.run_setup import run_setup

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={model}", "hardware=h200"])
    run_setup(cfg)  # raises ConfigError on a profile that cannot price the model


@pytest.mark.parametrize("span", [1, 7, 64, 65, 500])
@pytest.mark.parametrize("profile, results", [("ideal", None), ("measured", SMALL)])
def test_a_decode_span_prices_as_its_steps_one_by_one(host, span, profile, results):
    """``decode_span`` (a flat profile's closed form: Python floats up to ``SCALAR_SPAN``
    steps, numpy beyond; a measured profile's efficiency step by step) gives each step's
    phases and seconds bit for bit as ``phases`` does, a phase every step shares as one
    float."""
    from harness.engine.cost_operator import step_seconds

    model = _executor(profile, 16, host, results=results).cost_model
    # the flat profile's closed form, or a profile whose efficiency moves along the span
    assert (model.read_slot_at_constant_s is not None) == (profile == "ideal")
    for sum_positions, num_seqs in ((0, 1), (12_345, 50), (3_000_017, 256)):
        seconds, columns = model.decode_span(sum_positions, num_seqs, span)
        rows = [model.phases(num_seqs, 0, sum_positions + num_seqs * (i + 1), num_seqs, 0, 0,
                             num_seqs) for i in range(span)]
        assert [type(value) for value in columns] == [float, float, list, float, float,
                                                      float, float]
        laid = [value if type(value) is list else [value] * span for value in columns]
        assert [[v.hex() for v in column] for column in laid] == \
            [[v.hex() for v in column] for column in zip(*rows)]
        assert [s.hex() for s in seconds] == [step_seconds(row).hex() for row in rows]