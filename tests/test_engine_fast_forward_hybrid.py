"""The hybrid manager's fast-forward (``harness.engine.fast_forward_hybrid``) gives exactly
the step-by-step run: every step row (clock, memory columns, blocks per layer kind, phase
times), every request row, the generated tokens, and the manager's state after the run
(its blocks, free queue, prefix cache, counters and residency samples)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engine_helpers import HARDWARE, engine_spec, make_requests
from harness.config.specs import CostSpec, ModelSpec, SystemSpec
from harness.config.systems import build_manager
from harness.engine import fast_forward
from harness.engine.engine import run_engine
from harness.engine.executors import make_executor
from harness.engine.scheduler import Scheduler
from harness.models.model_layers import LinearAttentionSpec


def _model(pattern: tuple[str, ...], window: int | None = 64) -> ModelSpec:
    linear = (LinearAttentionSpec(num_key_heads=1, key_head_dim=8, num_value_heads=1,
                                  value_head_dim=8, conv_kernel=2) if "linear" in pattern else None)
    return ModelSpec(name="local", num_layers=2 * len(pattern), hidden_size=64, num_heads=4,
                     num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=1000,
                     max_context=4096, architecture="gemma3" if window else None,
                     sliding_window=window if "sliding" in pattern else None,
                     layer_pattern=pattern, linear_attention=linear)


SLIDING = _model(("sliding", "sliding", "full"))  # 4 sliding layers (2 KV cache groups), 2 full
NARROW = _model(("sliding", "full"), window=20)  # a window shorter than two blocks
LINEAR = _model(("linear", "full"), window=None)  # a state page per sequence, no prefix hits

COSTS = {"roofline": CostSpec(model="roofline", step_overhead_s=0.001),
         "ideal": CostSpec(model="operator", kernel_profile="ideal")}


def _hybrid(block_size: int = 16, prefix_caching: bool = True) -> SystemSpec:
    return SystemSpec(name="paged_hybrid", kind="paged_hybrid", prefix_caching=prefix_caching,
                      block_size=block_size)


def _run(requests, system: SystemSpec, model: ModelSpec, **spec):
    """(the run, its manager, the steps it ran in fast-forwarded spans)."""
    spec = engine_spec(**spec)
    manager = build_manager(system, spec.kv_capacity_slots, model, spec, 4096)
    executor = make_executor(spec, system, model, HARDWARE, manager)
    spans = []

    def counted(scheduler, executor, recorder, *args):
        first = len(recorder.steps["step"])
        advance = hybrid_fast_forward(scheduler, executor, recorder, *args)
        spans.append(len(recorder.steps["step"]) - first)
        return advance

    hybrid_fast_forward = fast_forward.hybrid_fast_forward  # (the name fast_forward calls)
    fast_forward.hybrid_fast_forward = counted
    try:
        result = run_engine(requests, Scheduler(manager, spec), executor, spec, max_model_len=4096)
    finally:
        fast_forward.hybrid_fast_forward = hybrid_fast_forward
    if hasattr(executor, "phase_columns"):
        result.recorder.add_columns(executor.phase_columns())
    return result, manager, sum(spans)


def _manager_state(manager) -> dict:
    """What the run leaves in the manager, block ids included (the span appends in the
    step-by-step order, so it takes and frees the very same blocks)."""
    pool, log = manager.pool, manager.pool.residency
    return {
        "report": manager.layer_group_report(), "stats": manager.stats,
        "breakdown": manager.breakdown(False), "free_queue": pool.free_queue(),
        "ref_cnt": list(pool.ref_cnt), "keys": [pool.key_of(b) for b in range(pool.num_blocks)],
        "evictions": pool.num_evictions,
        "residency": None if log is None else (list(log.lifetimes), list(log.idle_before_evict),
                                               list(log.reuse_gaps)),
    }


def _assert_same_run(requests, system: SystemSpec, model: ModelSpec = SLIDING, **spec) -> int:
    """The fast-forwarded run equals the step-by-step one; returns the steps it ran in spans."""
    slow, slow_manager, _ = _run(requests, system, model, fast_forward=False, **spec)
    fast, fast_manager, spanned = _run(requests, system, model, fast_forward=True, **spec)
    slow_steps, fast_steps = slow.recorder.step_table(), fast.recorder.step_table()
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    pd.testing.assert_frame_equal(slow.recorder.request_table(), fast.recorder.request_table(),
                                  check_exact=True)
    assert fast.output_digest == slow.output_digest
    assert slow.recorder.token_breaks == fast.recorder.token_breaks
    assert _manager_state(fast_manager) == _manager_state(slow_manager)
    return spanned


def _requests(seed: int, n: int = 40, gap: float = 0.002, prefix_len: int = 40,
              prompts: tuple[int, int] = (1, 400), outputs: tuple[int, int] = (1, 300)):
    rng = np.random.default_rng(seed)
    lengths = [(int(p), int(o)) for p, o in zip(rng.integers(*prompts, n), rng.integers(*outputs, n))]
    prefix = np.arange(prefix_len, dtype=np.int32) if prefix_len else None
    return make_requests(lengths, gap=gap, prefix=prefix, seed=seed)


CASES = {
    # windows of 64 tokens free blocks mid-span; a pool the queue waits for
    "sliding": (SLIDING, _hybrid(16), {}),
    "sliding_no_prefix_cache": (SLIDING, _hybrid(16, prefix_caching=False), {}),
    "sliding_block8": (SLIDING, _hybrid(8), {}),
    # few blocks: preemptions (recompute), the waiting head refused for memory mid-span
    "tight_pool": (SLIDING, _hybrid(16), {"kv_capacity_slots": 640}),
    "tight_pool_no_prefix_cache": (SLIDING, _hybrid(16, prefix_caching=False),
                                   {"kv_capacity_slots": 640}),
    "narrow_window": (NARROW, _hybrid(16), {"kv_capacity_slots": 768}),
    "chunked_prefill": (SLIDING, _hybrid(16), {"chunked_prefill": True,
                                               "max_num_batched_tokens": 96}),
    "max_num_seqs": (SLIDING, _hybrid(16), {"max_num_seqs": 5}),
    "linear": (LINEAR, _hybrid(16), {}),
}


@pytest.mark.parametrize("cost", sorted(COSTS))
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("gap", [0.0, 0.02])
def test_hybrid_fast_forward_matches_step_by_step(case, gap, cost):
    model, system, overrides = CASES[case]
    spec = {"kv_capacity_slots": 1024, "cost": COSTS[cost], **overrides}
    assert _assert_same_run(_requests(seed=len(case), gap=gap), system, model, **spec) > 0


@pytest.mark.parametrize("capacity", [768, 1024, 1536])
def test_spans_run_while_the_queue_head_is_refused_for_memory(capacity):
    """Long shared-prefix prompts that wait for memory while others decode: the spans keep
    the head refused as the windows return blocks, evict blocks of its prefix hit only in
    scheduled steps, and cover most decode steps."""
    requests = _requests(seed=3, n=30, gap=0.001, prefix_len=160, prompts=(170, 400),
                         outputs=(100, 300))
    ideal = COSTS["ideal"]
    ran = _assert_same_run(requests, _hybrid(16), SLIDING, kv_capacity_slots=capacity, cost=ideal)
    slow, _, _ = _run(requests, _hybrid(16), SLIDING, fast_forward=False,
                      kv_capacity_slots=capacity, cost=ideal)
    steps = slow.recorder.step_table()
    decode = steps[(steps["num_prefill_tokens"] == 0) & (steps["num_preempted"] == 0)]
    assert (decode["external_fragmentation"] > 0).mean() > 0.3  # the head waits for memory
    assert ran > len(decode) / 2


def _chat_requests(seed: int, sessions: int = 10, turns: int = 4, gap: float = 0.002):
    """Open-loop chat: turn k+1's prompt repeats turn k's prompt and answer (its
    ``output_token_ids``, keyed as the answer is decoded) and often arrives meanwhile."""
    from harness.workloads.request import Request

    rng = np.random.default_rng(seed)
    drafts = []
    for session in range(sessions):
        conversation = rng.integers(0, 1 << 29, 20, dtype=np.int32)
        arrival = session * 0.01
        for _ in range(turns):
            answer = rng.integers(0, 1 << 29, int(rng.integers(20, 120)), dtype=np.int32)
            prompt = conversation.copy()
            prompt.flags.writeable = answer.flags.writeable = False
            drafts.append((arrival, prompt, answer))
            user = rng.integers(0, 1 << 29, int(rng.integers(5, 40)), dtype=np.int32)
            conversation = np.concatenate([conversation, answer, user])
            arrival += gap
    drafts.sort(key=lambda d: d[0])
    return tuple(Request(i, t, prompt, len(answer), output_token_ids=answer)
                 for i, (t, prompt, answer) in enumerate(drafts))


@pytest.mark.parametrize("capacity", [768, 1536])
@pytest.mark.parametrize("seed", [0, 1])
def test_hybrid_fast_forward_on_chat_turns_that_hit_decoded_answers(seed, capacity):
    """Answers the workload gives are keyed as they decode and become the next turn's
    prefix hits: registrations and evictions in the step-by-step order."""
    assert _assert_same_run(_chat_requests(seed), _hybrid(16), SLIDING,
                            kv_capacity_slots=capacity) > 0


@pytest.mark.parametrize("num_samples", [2, 3])
def test_hybrid_fast_forward_with_parallel_sampling(num_samples):
    """Forked members share their prompt's partial block until each copies it on write."""
    rng = np.random.default_rng(num_samples)
    lengths = [(int(p), int(o)) for p, o in zip(rng.integers(1, 200, 24), rng.integers(1, 200, 24))]
    for gap in (0.0, 0.05):
        requests = make_requests(lengths, gap=gap, num_samples=num_samples, seed=num_samples)
        assert _assert_same_run(requests, _hybrid(16), SLIDING, kv_capacity_slots=2048) > 0
