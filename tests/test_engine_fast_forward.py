"""Fast-forwarding steady decode steps gives exactly the step-by-step figures."""

from __future__ import annotations

from array import array
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from engine_helpers import contiguous, engine_spec, make_requests, paged, run
from harness.config.specs import CostSpec
from harness.engine.spans import DecodingBatch
from harness.workloads.request import Request

# Every cost model and kernel profile prices fast-forwarded spans as step by step: the
# roofline, and the operator model with a flat, a tabulated (block size) and a measured
# (bilinear in batch and context, tests/data/kernel_results_small.json) kernel profile.
KERNEL_RESULTS = str(Path(__file__).parent / "data" / "kernel_results_small.json")
COSTS = {
    "roofline": CostSpec(model="roofline", step_overhead_s=0.001),
    "ideal": CostSpec(model="operator", kernel_profile="ideal"),
    "fa_before": CostSpec(model="operator", kernel_profile="fa_sm100_pr2104_before"),
    "measured": CostSpec(model="operator", kernel_profile="measured", kernel_results=KERNEL_RESULTS),
}


def _workload(seed: int, n: int = 60, gap: float = 0.02, prefix_len: int = 0):
    rng = np.random.default_rng(seed)
    lengths = [(int(p), int(o)) for p, o in zip(rng.integers(1, 300, n), rng.integers(1, 400, n))]
    prefix = np.arange(prefix_len, dtype=np.int32) if prefix_len else None
    if prefix is not None:
        lengths = [(max(p, prefix_len + 1), o) for p, o in lengths]
    return make_requests(lengths, gap=gap, prefix=prefix, seed=seed)


CASES = {
    "paged": (paged(16), {}),
    "paged_prefix": (paged(16, prefix_caching=True), {}),
    "paged_tight_pool": (paged(8), {"kv_capacity_slots": 2048}),
    "paged_block1": (paged(1), {}),
    "oracle": (contiguous("oracle"), {}),
    "max_first_fit": (contiguous("max", "first_fit"), {"kv_capacity_slots": 8192}),
    "static": (paged(16), {"scheduling": "static", "max_num_seqs": 8}),
    "swap": (paged(16), {"kv_capacity_slots": 1024, "preemption": "swap"}),
    # admission refused by max_num_seqs / the token budget (spans may start after a prefill)
    "max_num_seqs": (paged(16), {"max_num_seqs": 6}),
    "token_budget": (contiguous("oracle"), {"max_num_batched_tokens": 320, "max_model_len": 320}),
    "chunked_prefill": (paged(16, prefix_caching=True),
                        {"chunked_prefill": True, "max_num_batched_tokens": 96}),
    "chunked_tight": (paged(4), {"chunked_prefill": True, "max_num_batched_tokens": 64,
                                 "kv_capacity_slots": 1024}),
}


@pytest.mark.parametrize("cost", sorted(COSTS))
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("gap", [0.0, 0.05])
def test_fast_forward_matches_step_by_step(case, gap, cost):
    system, overrides = CASES[case]
    requests = _workload(seed=len(case), gap=gap, prefix_len=48 if "prefix" in case else 0)
    base = dict(kv_capacity_slots=4096, cost=COSTS[cost])
    base.update(overrides)
    max_model_len = base.pop("max_model_len", 1024)
    if max_model_len < 1024:
        requests = tuple(r for r in requests if r.kv_len <= max_model_len)
    _assert_same_run(requests, system, base, max_model_len)


def _assert_same_run(requests, system, base: dict, max_model_len: int = 1024) -> None:
    slow = run(requests, system, engine_spec(fast_forward=False, **base), max_model_len=max_model_len)
    fast = run(requests, system, engine_spec(fast_forward=True, **base), max_model_len=max_model_len)
    slow_steps, fast_steps = slow.recorder.step_table(), fast.recorder.step_table()
    assert len(slow_steps) == len(fast_steps)
    # exact, clock included: the bulk steps do the loop's float arithmetic in its order
    pd.testing.assert_frame_equal(slow_steps, fast_steps, check_exact=True)
    assert fast.output_digest == slow.output_digest
    pd.testing.assert_frame_equal(slow.recorder.request_table(), fast.recorder.request_table(),
                                  check_exact=True)


def _chat_requests(seed: int, sessions: int = 12, turns: int = 4, gap: float = 0.002):
    """Open-loop chat: turn k+1's prompt repeats turn k's prompt and answer (its
    ``output_token_ids``) and often arrives while turn k still decodes that answer."""
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


@pytest.mark.parametrize("capacity", [1024, 1536, 2048])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_fast_forward_matches_step_by_step_on_chat_with_prefix_caching(seed, capacity):
    """Decode blocks become prefix hits of waiting turns, and cached blocks are evicted
    mid-span: the span must stop where the head's cached prefix grows, and register and
    evict blocks in step order."""
    _assert_same_run(_chat_requests(seed), paged(16, prefix_caching=True),
                     dict(kv_capacity_slots=capacity))


@pytest.mark.parametrize("num_samples", [2, 3])
def test_fast_forward_matches_step_by_step_with_parallel_sampling(num_samples):
    """Multi-sequence groups decode (and finish) together inside a span."""
    rng = np.random.default_rng(num_samples)
    lengths = [(int(p), int(o)) for p, o in zip(rng.integers(1, 200, 30), rng.integers(1, 200, 30))]
    for gap in (0.0, 0.05):
        requests = make_requests(lengths, gap=gap, num_samples=num_samples, seed=num_samples)
        _assert_same_run(requests, paged(16, prefix_caching=True), dict(kv_capacity_slots=4096))


@pytest.mark.parametrize("gap", [0.0, 0.01])
def test_fast_forward_matches_step_by_step_when_the_token_budget_refuses(gap):
    """Long prompts that fit the token budget only thanks to a cached shared prefix: the
    head refused by the budget while others prefill may be admitted in the next step."""
    rng = np.random.default_rng(7)
    lengths = [(int(p), int(o)) for p, o in zip(rng.integers(200, 240, 80), rng.integers(8, 40, 80))]
    requests = make_requests(lengths, gap=gap, prefix=np.arange(160, dtype=np.int32), seed=7)
    _assert_same_run(requests, paged(16, prefix_caching=True),
                     dict(kv_capacity_slots=8192, max_num_batched_tokens=280))


@pytest.mark.parametrize("system", [paged(16, prefix_caching=True), contiguous("pow2")],
                         ids=["paged", "pow2"])
def test_arrivals_behind_a_blocked_queue_head_do_not_end_a_span(system, monkeypatch):
    """Saturated memory: most requests arrive while others wait. They queue behind the
    blocked head inside fast-forwarded spans, and every figure stays exact."""
    import harness.engine.engine as engine

    requests = _workload(seed=7, n=120, gap=0.01)
    base = dict(kv_capacity_slots=1536)
    _assert_same_run(requests, system, base)
    spans = []  # (first row, last row) of each fast-forwarded span

    def watched(scheduler, executor, recorder, *args):
        first = len(recorder.steps["step"])
        advance = fast_forward(scheduler, executor, recorder, *args)
        if advance is not None:
            spans.append((first, len(recorder.steps["step"]) - 1))
        return advance

    fast_forward = engine.fast_forward
    monkeypatch.setattr(engine, "fast_forward", watched)
    steps = run(requests, system, engine_spec(**base)).recorder.step_table()
    assert (steps["num_waiting"] > 0).mean() > 0.5  # saturated
    waiting = steps["num_waiting"].to_numpy()
    absorbed = [(first, last) for first, last in spans if waiting[last] > waiting[first]]
    assert len(absorbed) >= 5  # spans in which the waiting queue grew


@pytest.mark.parametrize("count", [1, 5, 300, 5000])
def test_decoded_tokens_read_as_if_stored(count):
    """Tokens generated by count (``decode_synthetic``, a sampling step) read the same
    (``token_at``, ``generated_ids``, ``token_ids``, the batch's ``kv_tokens``) as the
    same tokens stored one by one (``append_token``): plain ids, ids that wrap around
    ``SYNTHETIC_TOKEN_BASE``, the ids a workload gives, and a sequence whose first tokens
    are stored (a beam's) before synthetic ones."""
    from harness.engine.sequence import (SYNTHETIC_TOKEN_BASE, Sequence, SequenceGroup,
                                         decode_synthetic, kv_span)

    given = np.arange(10_000, 10_000 + 6000, dtype=np.int32)
    requests = [Request(0, 0.0, np.arange(3, dtype=np.int32), 6000),
                Request(1, 0.0, np.arange(3, dtype=np.int32), 6000, output_token_ids=given)]

    def make(i, request, offset=None, stored=None):
        group = SequenceGroup(request)
        seq = Sequence(i, group, 0, stored)
        group.seqs.append(seq)
        if offset is not None:
            seq.synthetic_offset = offset
        return seq

    def streams():  # plain, given, wrapping (after 10 tokens; 7: at the span), stored
        return [make(0, requests[0]), make(1, requests[1]),
                make(2, requests[0], SYNTHETIC_TOKEN_BASE - 10),
                make(3, requests[0], SYNTHETIC_TOKEN_BASE - 7),
                make(4, requests[0], None, array("q", [5, 6, 7, 8])),
                make(5, requests[0], None, array("q", range(100, 107)))]

    lazy, eager = streams(), streams()
    for seq in lazy:
        decode_synthetic([seq], 7 - seq.num_generated)
        seq.num_computed = 0
    for seq in eager:
        for i in range(seq.num_generated, 7):
            seq.append_token(seq.synthetic_token_at(i))
    assert [len(seq.stored) for seq in lazy] == [0, 0, 0, 0, 4, 7]
    spans = [list(kv_span(seq.token_at(6), seq.synthetic_tokens(7, count))) for seq in eager]
    for seq in lazy:
        seq.num_computed = seq.prompt_len + 6  # decoding: all but its last token's KV
    batch = DecodingBatch.of(SimpleNamespace(running=[seq.group for seq in lazy]))
    assert [list(tokens) for tokens in batch.kv_tokens(count)] == spans
    decode_synthetic(lazy, count)
    for seq in eager:
        for i in range(7, 7 + count):
            seq.append_token(seq.synthetic_token_at(i))
    total = 7 + count
    assert [seq.num_computed for seq in lazy] == [3 + 6 + count] * len(lazy)
    assert all(len(seq.stored) == total for seq in eager)
    for seq, ref in zip(lazy, eager):
        expected = ref.stored.tolist()
        assert seq.num_generated == total and seq.num_tokens == ref.num_tokens
        assert seq.generated_ids().tolist() == expected
        assert seq.generated_ids().tobytes() == ref.stored.tobytes()  # (the digest's bytes)
        assert seq.generated_ids(2, 6).tolist() == expected[2:6]
        assert seq.generated_ids(5, total - 1).tolist() == expected[5:-1]
        assert [seq.token_at(i) for i in (0, 3, 4, 6, 9, -1) if i < total] == \
            [expected[i] for i in (0, 3, 4, 6, 9, -1) if i < total]
        for start, end in ((0, 3), (1, 9), (3, 3 + total), (5, 8)):
            ids = seq.token_ids(start, end)
            assert ids.dtype == np.int32 and ids.tolist() == ref.token_ids(start, end).tolist()
        seq.append_token(-5)  # a sampled token stores the synthetic ones before it
        assert seq.generated_ids().tolist() == expected + [-5]
        assert seq.stored.tolist() == expected + [-5] and seq.token_at(-1) == -5


def test_arrivals_joined_by_counts_the_requests_that_joined_before_each_step():
    """Each step's count of joined requests (rejected ones left out) equals a direct count
    of the requests that arrived by its start: steps with none, several or one arrival
    between them, arrivals exactly at a start, and none left after the span."""
    from harness.engine.fast_forward import Arrivals

    rng = np.random.default_rng(7)
    for _ in range(300):
        times = np.sort(rng.choice([0.5, 1.0, 2.0, 3.5], 12) * rng.integers(0, 4, 12)).tolist()
        reasons = [None if keep else "rejected" for keep in rng.random(12) < 0.7]
        arrivals = Arrivals.of([Request(i, t, np.arange(2, dtype=np.int32), 1)
                                for i, t in enumerate(times)], reasons)
        arrivals.next = int(rng.integers(0, 13))
        # step starts between, before, after and exactly at arrival times
        pool = times + [t + 0.25 for t in times] + [-1.0, 20.0]
        starts = sorted(set(rng.choice(pool, int(rng.integers(1, 10))).tolist()))
        expected = [sum(1 for i in range(arrivals.next, len(times))
                        if times[i] <= start and reasons[i] is None) for start in starts]
        assert arrivals.joined_by(starts) == expected
        assert arrivals.joined_by(starts, 3) == [3 + count for count in expected]  # + queued


def test_paged_span_events_match_a_step_by_step_walk():
    """A span's per-step block figures equal those of walking its steps one by one, each
    sequence appending one token: a block taken where a position starts one, with target
    ``min(block, tokens left to write)``; reserved slots grow by the target less the one
    written (one written at every other step), rounding by what the target leaves of the
    block. Spans shorter and longer than a block, sequences finishing in them."""
    from harness.engine.fast_forward import _paged_span_events

    rng = np.random.default_rng(11)
    for _ in range(400):
        bs = int(rng.choice([1, 2, 4, 16, 32]))
        span = int(rng.integers(1, 3 * bs + 3))
        n = int(rng.integers(1, 40))
        computed = rng.integers(1, 400, n).tolist()
        remaining = (span + rng.integers(0, 2 * bs + 2, n)).tolist()  # none passes its end
        news, reserved, rounding, block_steps = [0] * span, [0] * span, [0] * span, []
        for i, (c, left) in enumerate(zip(computed, remaining)):
            for j in range(span):
                if (c + j) % bs == 0:  # this append starts a block
                    target = min(bs, left - j)
                    news[j] += 1
                    reserved[j] += target - 1
                    rounding[j] += bs - target
                    block_steps.append((i, j))
                else:
                    reserved[j] -= 1
        by_sequence = [j for _, j in sorted(block_steps)]
        assert _paged_span_events(computed, remaining, bs, span) == (
            news, reserved, rounding, by_sequence)


def test_decoding_batch_reads_every_running_sequence_in_order():
    """``DecodingBatch.of`` equals a walk over each running group's sequences: groups of
    one sequence (given tokens or not), parallel samples among them, a beam search (no
    batch), a sequence still prefilling or yet to sample its first token (no batch)."""
    from harness.engine.sequence import Sequence, SequenceGroup

    def reference(running):
        seqs = [seq for group in running for seq in group.seqs]
        if any(group.request.beam_width > 1 for group in running) or any(
                seq.num_computed != seq.prompt_len + seq.num_generated - 1
                or not seq.num_generated for seq in seqs):
            return None
        return DecodingBatch(seqs, [seq.num_computed for seq in seqs],
                             [seq.output_len - seq.num_generated for seq in seqs],
                             [i for i, seq in enumerate(seqs) if seq.synthetic_offset < 0])

    rng = np.random.default_rng(5)
    given = np.arange(50, dtype=np.int32)
    for trial in range(300):
        running = []
        for r in range(int(rng.integers(1, 12))):
            kind = rng.choice(["single", "given", "samples", "beams"], p=[0.7, 0.1, 0.15, 0.05])
            request = Request(r, 0.0, np.arange(int(rng.integers(1, 40)), dtype=np.int32), 50,
                              num_samples=3 if kind == "samples" else 1,
                              beam_width=2 if kind == "beams" else 1,
                              output_token_ids=given if kind == "given" else None)
            group = SequenceGroup(request)
            group.seqs = [Sequence(10 * r + i, group, i) for i in range(group.width)]
            for seq in group.seqs:
                seq.num_generated = int(rng.integers(1, 50))
                seq.num_computed = seq.prompt_len + seq.num_generated - 1
                if rng.random() < 0.02:  # prefilling, or its prompt's last token to compute
                    seq.num_generated, seq.num_computed = 0, int(rng.integers(0, seq.prompt_len))
            running.append(group)
        assert DecodingBatch.of(SimpleNamespace(running=running)) == reference(running)
