"""Attention cost by layer group (harness/engine/cost_layers.py, cost_layered.py): sliding
windows, MLA and linear layers against hand arithmetic and brute-force counts; uniform
models keep their cost models; fast-forwarded spans stay exact on layered models."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from engine_helpers import HARDWARE, MODEL, engine_spec, paged
from harness.config.specs import CostSpec
from harness.engine.cost_layers import WORK, WindowSpan, layered_attention, plan_work, window_prefix
from harness.engine.cost_operator import PHASES, OperatorCostModel
from harness.engine.engine import run_engine
from harness.engine.executors import make_cost_model, make_executor
from harness.engine.plan import ScheduledChunk, StepPlan
from harness.engine.scheduler import Scheduler
from harness.engine.sim_executor import RooflineCostModel, SimExecutor
from harness.models.model_layers import LinearAttentionSpec, MlaSpec
from harness.config.systems import build_manager
from test_engine_fast_forward import COSTS, _workload
from test_model_layers import model as conf_model

DECODE, PREFILL, WRITE = (PHASES.index(p) for p in ("attention_decode", "attention_prefill", "kv_write"))
IDEAL = CostSpec(model="operator", kernel_profile="ideal")  # efficiency 1 at any batch / context
ROOFLINE = CostSpec(model="roofline", step_overhead_s=0.0)
# MODEL's dimensions (2 layers, 4 heads of 16, fp16: 256 bytes of K and V a token and layer)
SLIDING = replace(MODEL, sliding_window=64)
HYBRID = replace(MODEL, num_layers=4, sliding_window=64, layer_pattern=("sliding", "full"),
                 architecture="gemma2")
MLA = replace(MODEL, architecture="deepseek_v3", mla=MlaSpec(32, 8, 16, 16))
LINEAR = replace(MODEL, num_layers=4, architecture="qwen3_next", layer_pattern=("linear", "full"),
                 linear_attention=LinearAttentionSpec(2, 16, 4, 16, 4))


def _executor(model, cost=IDEAL, hardware=HARDWARE) -> SimExecutor:
    return SimExecutor(make_cost_model(cost, paged(16), model, hardware), 16)


def _decodes(starts) -> StepPlan:
    plan = StepPlan()
    plan.add_decodes([None] * len(starts), list(starts))
    return plan


def _decode_phase(model, starts, **kw) -> float:
    executor = _executor(model, **kw)
    executor.execute(_decodes(starts))
    return executor.phase_rows[-1][DECODE]


def _kv_bytes(model, plan, hardware=HARDWARE) -> float:
    """The roofline's bytes moved by the step, less the weights read once."""
    cost = make_cost_model(ROOFLINE, paged(16), model, hardware)
    executor = SimExecutor(cost, 16)
    seconds, _ = executor.execute(plan)
    return seconds * cost.bandwidth - cost.weight_bytes  # overhead 0; the step is memory bound


def test_uniform_full_attention_models_keep_their_cost_models():
    for model in (MODEL, conf_model("llama-2-13b"), conf_model("llama-3.1-8b"), conf_model("qwen3-8b")):
        assert layered_attention(model) is None
        assert type(make_cost_model(IDEAL, paged(16), model, HARDWARE)) is OperatorCostModel
        assert type(make_cost_model(ROOFLINE, paged(16), model, HARDWARE)) is RooflineCostModel
    for model in (SLIDING, HYBRID, MLA, LINEAR, conf_model("mistral-7b"), conf_model("deepseek-v3")):
        assert layered_attention(model) is not None


def test_a_sliding_layer_reads_the_full_context_below_the_window_and_w_tokens_beyond():
    # below the window (contexts 11, 31, 61 <= 64) a sliding model is the full one
    assert _decode_phase(SLIDING, [10, 30, 60]) == pytest.approx(_decode_phase(MODEL, [10, 30, 60]), rel=1e-12)
    # contexts of 1024 = 16 W: each decode reads W of them
    full = _decode_phase(MODEL, [1023] * 4)
    assert _decode_phase(SLIDING, [1023] * 4) == pytest.approx(full * 64 / 1024, rel=1e-12)
    # by hand: 4 decodes x 64 tokens x 2 layers x 256 bytes at 100 GB/s
    assert _decode_phase(SLIDING, [1023] * 4) == pytest.approx(4 * 64 * 2 * 256 / 100e9, rel=1e-12)


@pytest.mark.parametrize("cost", ["operator", "roofline"])
def test_gemma_2_decode_at_32k_reads_half_the_layers_windowed(cost):
    """Gemma-2-9b: 21 sliding (W 4096) and 21 global layers. A decode at context 32,768
    reads (1 + 4096 / 32768) / 2 = 0.5625 of what 42 global layers read."""
    gemma = conf_model("gemma-2-9b", max_context=131072)
    all_full = conf_model("gemma-2-9b", max_context=131072, sliding_window=None, layer_pattern=None,
                          architecture="llama")
    hardware = replace(HARDWARE, hbm_bandwidth_gbps=4800.0, peak_fp16_tflops=989.0)
    starts = [32767] * 8
    if cost == "operator":
        ratio = (_decode_phase(gemma, starts, hardware=hardware)
                 / _decode_phase(all_full, starts, hardware=hardware))
    else:
        ratio = _kv_bytes(gemma, _decodes(starts), hardware) / _kv_bytes(all_full, _decodes(starts), hardware)
    assert ratio == pytest.approx(0.5625, rel=1e-9)


def test_mla_reads_its_latent_and_decodes_compute_bound_on_an_h200():
    deepseek = conf_model("deepseek-v3")
    layers = layered_attention(deepseek)
    assert layers.context_bytes == (512 + 64) * 2 * 61  # bf16 latent + rope key, 61 layers
    assert layers.kv_write_bytes == deepseek.bytes_per_slot
    # the roofline's KV bytes: one decode at context 1000 reads 1,000 slots, writes its own
    h200 = replace(HARDWARE, hbm_bandwidth_gbps=4800.0, peak_fp16_tflops=989.0)
    plan = _decodes([999])
    cost = make_cost_model(ROOFLINE, paged(16), deepseek, h200)
    step = cost.layered_step_cost(1, plan.attention_pairs, plan.kv_read_slots,
                                  plan_work(plan, layers), num_seqs=1)
    assert step.bytes - cost.weight_bytes == pytest.approx((999 + 1) * 576 * 2 * 61, rel=1e-12)
    # absorbed decode: per pair and layer 2 x 128 heads x (576 + 512) FLOPs (FlashMLA's count)
    # = 278,528 for 1,152 bytes: 242 FLOPs a byte, above the H200 ridge of 989/4.8 = 206 at
    # equal efficiencies; the operator model prices the decode at the compute time
    spec = CostSpec(model="operator", kernel_profile="ideal", compute_efficiency=1.0,
                    bandwidth_efficiency=1.0)
    decode = _decode_phase(deepseek, [32767] * 16, cost=spec, hardware=h200)
    flops = 16 * 32768 * 61 * 2 * 128 * (576 + 512)
    assert decode == pytest.approx(flops / 989e12, rel=1e-12)
    assert decode > 16 * 32768 * 61 * 1152 / 4800e9


def test_a_linear_layer_reads_and_writes_its_state_and_no_context():
    # LINEAR: 2 linear layers of 4 value heads x 16 x 16 state + (4 - 1) x (2 x 32 + 64)
    # conv state = 1,408 values, fp16: 2,816 bytes a layer; 2 full layers of 256 bytes a token
    state = 2 * (4 * 16 * 16 + 3 * (2 * 32 + 64)) * 2
    assert layered_attention(LINEAR).state_bytes == state
    for context in (10, 1000):
        executor = _executor(LINEAR)
        executor.execute(_decodes([context - 1] * 3))
        row = executor.phase_rows[-1]
        hand_decode = 3 * context * 2 * 256 / 100e9 + 3 * state / (100e9 * 0.8)
        assert row[DECODE] == pytest.approx(hand_decode, rel=1e-12)
        assert row[WRITE] == pytest.approx(3 * (2 * 256 + state) / (100e9 * 0.8), rel=1e-12)


def test_window_pairs_and_span_reads_equal_brute_force_counts():
    rng = np.random.default_rng(0)
    for window in (1, 2, 7, 64):
        brute = [sum(min(q, window) for q in range(1, x + 1)) for x in range(200)]
        assert [window_prefix(x, window) for x in range(200)] == brute
        for _ in range(50):
            start = int(rng.integers(0, 150))
            end = start + int(rng.integers(1, 50))
            pairs = sum(min(p + 1, window) for p in range(start, end))
            assert layered_attention(replace(SLIDING, sliding_window=window)).window_keys(start, end) == pairs
        positions = rng.integers(0, 3 * window + 5, 9).tolist()
        span = WindowSpan(positions, window)
        for step in range(3 * window + 10):
            assert span.slots(step) == sum(min(p + step + 1, window) for p in positions)


def test_a_mixed_plan_counts_windowed_work_per_chunk():
    layers = layered_attention(SLIDING)  # W = 64
    plan = _decodes([10, 100])  # reads 11 and 64
    plan.add_chunk(ScheduledChunk(SimpleNamespace(num_tokens=200, num_generated=0, seq_id=5), 40, 140))
    work = dict(zip(WORK, plan_work(plan, layers)))
    assert work["prefill_pairs"] == sum(p + 1 for p in range(40, 140))
    assert work["prefill_window"] == sum(min(p + 1, 64) for p in range(40, 140))
    assert work["decode_pairs"] == 11 + 101 and work["decode_window"] == 11 + 64
    assert (work["prefill_seqs"], work["prefill_tokens"], work["decode_seqs"]) == (1, 100, 2)
    assert work["window_read"] == 10 + 63 + 40  # cached keys before each chunk


def _run(requests, spec, model):
    manager = build_manager(paged(16), spec.kv_capacity_slots, model, spec, 1024)
    executor = make_executor(spec, paged(16), model, HARDWARE, manager)
    result = run_engine(requests, Scheduler(manager, spec), executor, spec, max_model_len=1024)
    result.recorder.add_columns(executor.phase_columns())
    return result


@pytest.mark.parametrize("cost", sorted(COSTS))
@pytest.mark.parametrize("model", ["sliding", "hybrid", "mla", "linear"])
def test_fast_forward_is_exact_on_layered_models(model, cost):
    """Spans cross the window (prompts to 300 tokens, answers to 400, W 64) mid-span."""
    spec_model = {"sliding": SLIDING, "hybrid": HYBRID, "mla": MLA, "linear": LINEAR}[model]
    for gap in (0.0, 0.05):
        requests = _workload(seed=3, gap=gap)
        spec = engine_spec(kv_capacity_slots=4096, cost=COSTS[cost], chunked_prefill=gap > 0,
                           max_num_batched_tokens=4096 if gap == 0 else 256)
        slow = _run(requests, replace(spec, fast_forward=False), spec_model)
        fast = _run(requests, replace(spec, fast_forward=True), spec_model)
        pd.testing.assert_frame_equal(slow.recorder.step_table(), fast.recorder.step_table(),
                                      check_exact=True)
        pd.testing.assert_frame_equal(slow.recorder.request_table(), fast.recorder.request_table(),
                                      check_exact=True)


def test_prefill_attention_counts_windowed_and_mla_pairs():
    # a 200-token prompt on SLIDING (W 64): brute-force pairs x 4 x 2 layers x 4 heads x 16
    # FLOPs at 10 TFLOPS x 0.6
    executor = _executor(SLIDING)
    plan = StepPlan()
    plan.add_chunk(ScheduledChunk(SimpleNamespace(num_tokens=201, num_generated=0, seq_id=1), 0, 200))
    executor.execute(plan)
    pairs = sum(min(p + 1, 64) for p in range(200))
    assert executor.phase_rows[-1][PREFILL] == pytest.approx(pairs * 4 * 2 * 4 * 16 / 6e12, rel=1e-12)
    # DeepSeek-V3 prefills unabsorbed: 2 x 128 heads x (128 + 64 + 128) FLOPs a pair and layer
    deepseek = conf_model("deepseek-v3")
    executor = _executor(deepseek, hardware=replace(HARDWARE, peak_fp16_tflops=989.0))
    plan = StepPlan()
    plan.add_chunk(ScheduledChunk(SimpleNamespace(num_tokens=1001, num_generated=0, seq_id=1), 0, 1000))
    executor.execute(plan)
    flops = 1000 * 1001 // 2 * 61 * 2 * 128 * (128 + 64 + 128)
    assert executor.phase_rows[-1][PREFILL] == pytest.approx(flops / (989e12 * 0.6), rel=1e-12)
