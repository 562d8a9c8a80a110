"""Fast-forward for the hybrid manager (``paged_hybrid``, ``Capabilities.bulk_decode ==
"hybrid"``): a span of steady decode steps run without the scheduler.

NOTE: not a closed form, unlike ``fast_forward``'s paged one. A sliding window returns
blocks to the free queue mid-span (cached, so later allocations evict them in queue
order), a returned block may be another table's too, and the waiting head's need
depends on which blocks of its prefix hit are still cached. So the span appends one
token per sequence step by step, in running order, through the manager's own
``append`` (every block, key, eviction and residency sample is the step-by-step run's),
and records each step's breakdown; what it skips is the scheduler: its plan, the
admission check of the waiting head (its prefix hit and the blocks of it admission would
take: thousands on gemma-3-27b longdoc), the executor's pricing of each step (the span
is priced at once) and the sampling (``decode_synthetic``).

A step of the span is run only if, before it, the manager's figures show the scheduler
would run it as a plain decode step:

- no preemption: the blocks it allocates fit the free blocks (not counting those it
  returns: a bound, so the span may end a step early, never late);
- the waiting head stays refused after the step's appends: refused by ``max_num_seqs`` or
  the token budget (fixed during a span), or for memory while its need (free blocks its
  admission takes) exceeds the free blocks after the step, counting every block the
  window drops as returned. Its need stays valid while no block of its prefix hit is
  evicted (``next_blocks``: the blocks the step pops) and no block gets a key of its
  prompt: decode blocks are keyed by synthetic tokens, unique to their sequence, so only
  tokens a workload gives could, and such spans are not fast-forwarded while requests wait.

Otherwise the span ends before that step and the engine schedules it. The span ends,
as a paged one does, at the step in which the next request arrives at an empty queue or
in which requests finish (freed after its row is recorded).
``tests/test_engine_fast_forward_hybrid.py`` checks every step row, the request rows and
the manager's state after the run against the step-by-step run.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from harness.engine.scheduler import Scheduler
from harness.engine.sequence import SequenceGroup, decode_synthetic
from harness.engine.spans import MAX_SPAN, PRICE_WINDOW, Advance, Arrivals, DecodingBatch
from harness.metrics.summaries import RunRecorder

_ONE_TOKEN = (0,)  # a step's KV token when no prefix cache reads its id


def hybrid_fast_forward(scheduler: Scheduler, executor, recorder: RunRecorder, now: float,
                        arrivals: Arrivals) -> Advance | None:
    """Run as many steady decode steps of a hybrid manager as the scheduler would run
    plainly, or return None (nothing done). ``fast_forward``'s contract (its checks on
    the next arrival and the token budget already made)."""
    manager = scheduler.manager
    batch = DecodingBatch.of(scheduler)
    if batch is None:
        return None  # beams, or a sequence still prefilling
    seqs, computed, remaining = batch.seqs, batch.computed, batch.remaining
    seq_ids = [seq.seq_id for seq in seqs]
    if not all(map(manager.can_append_without_copy, seq_ids)):
        return None  # a shared partial block is copied first
    workload_tokens = bool(batch.workload_tokens)  # some generate tokens the workload gives
    keyed = manager.capabilities.prefix_cache
    if keyed and workload_tokens and scheduler.waiting:
        return None  # a decode block may extend the waiting head's prefix hit
    # NOTE: asked once every sequence decodes (after a prefill step, one often does not)
    blocked = scheduler.admission_while_decoding(True)  # (memory may have come back: ask)
    if blocked is None:
        return None  # the next step may admit
    head_need = _head_need(scheduler) if blocked else None  # (need, blocks of its hit)
    num_seqs = len(seqs)
    first_finish = min(remaining)
    span = min(first_finish, MAX_SPAN)
    next_arrival_time = None if scheduler.waiting else arrivals.next_time
    durations, clock, span, arrived = _price(executor, computed, num_seqs, span, now,
                                             next_arrival_time)
    taken, dropped = manager.decode_span_events(seq_ids, span)  # [span] each

    # The steps, one by one, while the scheduler would run each as a plain decode step.
    kv_tokens = batch.kv_tokens(span) if keyed else None  # [num_seqs] of [span]
    step_tokens = [_ONE_TOKEN] * num_seqs  # each one's KV token in a step (its id unread)
    waiting = len(scheduler.waiting)
    if waiting:  # arrivals queue behind the head before each step starts
        num_waiting = arrivals.joined_by(clock[:span], waiting)
    else:
        num_waiting = [0] * span
    pool = manager.pool
    residency = pool.residency
    append, breakdown, record = manager.append, manager.breakdown, recorder.record_step
    need, hit_blocks = head_need if head_need is not None else (0, set())
    ran = 0
    for j in range(span):
        free = pool.num_free
        if taken[j] > free:
            break  # it may preempt
        if head_need is not None:
            if need <= free - taken[j] + dropped[j]:
                break  # the head may fit after its appends
            if taken[j] and not hit_blocks.isdisjoint(manager.next_blocks(taken[j])):
                break  # it evicts a block of the head's hit
        if residency is not None:
            residency.now = clock[j]  # (a step's blocks are taken and dropped at its start)
        if kv_tokens is not None:
            step_tokens = [tokens[j:j + 1] for tokens in kv_tokens]
        for seq_id, tokens in zip(seq_ids, step_tokens):
            if append(seq_id, tokens) is None:  # pragma: no cover - invariant
                raise RuntimeError("hybrid fast-forward: append failed after the memory check")
        record(clock[j], durations[j], num_seqs, num_seqs, 0, num_waiting[j], 0, breakdown(blocked))
        ran += 1
    if ran < span:
        span, arrived = ran, False
        if not span:
            return None
    end_time = clock[span]
    executor.decoded_span(sum(computed), num_seqs, span, computed)
    decode_synthetic(seqs, span)
    finished: list[SequenceGroup] = []
    if span == first_finish:  # the groups of the sequences done now, in running order
        done = {seqs[i].group: None for i, left in enumerate(remaining) if left == span}
        finished = scheduler.finish_decoded(end_time, list(done))
    elif residency is not None:
        residency.now = end_time
    may_continue = bool(finished) and not arrived and scheduler.num_running_seqs > 0
    return Advance(end_time, finished, may_continue)


def _price(executor, computed: list[int], num_seqs: int, span: int, now: float,
           next_arrival_time: float | None) -> tuple[list[float], list[float], int, bool]:
    """``(durations [span], clock [span + 1], span, arrived)``: the steps priced (a short
    window first when an arrival may end the span), each step's start then the last
    one's end (summed in order, like the loop's clock), cut at the step the next arrival
    lands in (the first to end at or after it)."""
    sum_positions = sum(computed)
    priced = min(span, PRICE_WINDOW) if next_arrival_time is not None else span
    while True:
        durations = executor.decode_durations(sum_positions, num_seqs, priced, computed)
        clock = list(accumulate(durations, initial=float(now)))
        arrived = next_arrival_time is not None and clock[-1] >= next_arrival_time
        if arrived or priced == span:
            break
        priced = span
    if arrived:
        span = bisect_left(clock, next_arrival_time, 1)  # (the clock never goes back)
    return durations[:span], clock[:span + 1], span, arrived


def _head_need(scheduler: Scheduler) -> tuple[int, set[int]]:
    """The free blocks admitting the waiting head (refused for memory) would take, and the
    blocks of its prefix hit: ``Scheduler._refused_for_memory``'s question, kept as figures."""
    budget = scheduler.spec.max_num_batched_tokens - scheduler.num_running_seqs
    tokens, target = scheduler.admission_target(scheduler.waiting[0], budget)
    return scheduler.manager.admission_need(tokens, target)

