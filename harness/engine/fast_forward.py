"""Advance many pure-decode steps at once, keeping every per-step figure exact.

Between events (an arrival, a request finishing, a preemption, a prefill, a
copy-on-write) every running sequence only appends one token per step, and the
scheduler's decisions cannot change: memory only shrinks, so a refused waiting
request stays refused. The sim executor can therefore charge K such steps in
closed form, append K tokens per sequence in one manager call, and write K step
rows computed from per-sequence formulas, instead of looping K times.

``tests/test_engine_fast_forward.py`` checks that every step row equals the
step-by-step run (block ids may differ: a bulk append takes a sequence's new
blocks together, but no figure depends on which ids they are).
"""

from __future__ import annotations

import numpy as np

from allocators.contiguous import ContiguousKVCacheManager
from allocators.paged import PagedKVCacheManager
from harness.engine.scheduler import Scheduler, StepPlan
from harness.engine.sequence import Sequence
from harness.metrics import RunRecorder

# Fewer steps than this are not worth the setup: run them one by one.
MIN_SPAN = 3
MAX_SPAN = 4096


def plan_allows_fast_forward(plan: StepPlan, scheduler: Scheduler, finished_any: bool) -> bool:
    """Cheap checks on the step that just ran: was it a steady, event-free decode step?"""
    if (plan.num_prefill_tokens or plan.num_preempted or plan.swap_in or plan.swap_out
            or plan.copies or scheduler.swapped or scheduler._pending_copies):
        return False
    if finished_any and scheduler.waiting:
        return False  # memory was freed: the next schedule may admit
    return len(plan.chunks) == scheduler.num_running_seqs > 0


def fast_forward(scheduler: Scheduler, executor, recorder: RunRecorder, plan: StepPlan,
                 now: float, next_arrival_time: float | None) -> float | None:
    """Run as many steady decode steps as possible in bulk; return the new clock or None."""
    manager = scheduler.manager
    seqs: list[Sequence] = []
    for group in scheduler.running:
        if group.request.beam_width > 1:
            return None  # beams are re-selected every step
        seqs.extend(group.seqs)
    num_seqs = len(seqs)
    positions = np.fromiter((s.num_computed for s in seqs), dtype=np.int64, count=num_seqs)
    remaining = min(s.group.request.output_len - len(s.generated) for s in seqs)
    span = min(remaining - 1, MAX_SPAN)  # the step that finishes a request runs normally
    if span < MIN_SPAN:
        return None
    finals = np.fromiter((s.final_len for s in seqs), dtype=np.int64, count=num_seqs)
    steps = np.arange(1, span + 1, dtype=np.int64)  # tokens appended after each step
    written = positions[:, None] + steps[None, :]  # [num_seqs, span]

    paged = isinstance(manager, PagedKVCacheManager)
    if paged:
        bs = manager.block_size
        if not all(manager.can_append_without_copy(s.seq_id) for s in seqs):
            return None  # a shared partial block must be copied first
        blocks = -(-written // bs)  # [num_seqs, span]
        new_blocks = (blocks - (-(-positions // bs))[:, None]).sum(axis=0)  # [span]
        fits = new_blocks <= manager.num_free_blocks
        span = int(fits.argmin()) if not fits.all() else span
        if span < MIN_SPAN:
            return None
    elif not isinstance(manager, ContiguousKVCacheManager):
        return None

    durations = executor.decode_durations(int(positions.sum()), num_seqs, span)  # [span]
    ends = np.cumsum(np.concatenate(([now], durations)))[1:]  # sequential, like the loop
    if next_arrival_time is not None:
        crossed = np.nonzero(ends >= next_arrival_time)[0]
        if len(crossed):
            span = min(span, int(crossed[0]) + 1)
            if span < MIN_SPAN:
                return None
    durations, ends, steps, written = durations[:span], ends[:span], steps[:span], written[:, :span]

    base = manager.breakdown(plan.memory_blocked)
    appended = steps * num_seqs  # [span] tokens appended so far, all sequences
    if paged:
        blocks = blocks[:, :span]
        start_blocks = -(-positions // bs)
        allocated = base.allocated_slots + bs * (blocks - start_blocks[:, None]).sum(axis=0)
        reserved_now, rounding_now = _paged_partial(positions[:, None], finals[:, None], bs)
        reserved_after, rounding_after = _paged_partial(written, finals[:, None], bs)
        reserved = base.reserved + (reserved_after - reserved_now).sum(axis=0)
        rounding = base.internal_rounding + (rounding_after - rounding_now).sum(axis=0)
        popped = (blocks - start_blocks[:, None]).sum(axis=0)  # [span] blocks taken so far
        flags = manager.pool.cached_flags_at_head(int(popped[-1]))  # evicted in queue order
        cached_popped = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
        cached_free = base.cached_free_slots - bs * cached_popped[popped]
    else:
        allocated = np.full(span, base.allocated_slots, dtype=np.int64)
        reserved = base.reserved - appended
        rounding = np.full(span, base.internal_rounding, dtype=np.int64)
        cached_free = np.full(span, base.cached_free_slots, dtype=np.int64)
    token_states = base.token_states + appended
    free = base.capacity_slots - allocated
    zeros = np.zeros(span, dtype=np.int64)
    largest_free = free if paged else np.full(span, base.largest_free_extent, dtype=np.int64)

    # Commit: sample and append the span's tokens, one manager call per sequence.
    for seq in seqs:
        start = seq.num_computed
        first = len(seq.generated)
        seq.generated.extend(seq.synthetic_token_at(first + j) for j in range(span))
        if manager.append(seq.seq_id, seq.token_ids(start, start + span)) is None:
            raise RuntimeError("fast-forward: append failed after the memory check")  # invariant
        seq.num_computed = start + span

    recorder.record_steps(
        time_s=ends - durations, duration_s=durations, num_seqs=np.full(span, num_seqs),
        num_batched_tokens=np.full(span, num_seqs), num_prefill_tokens=zeros,
        num_waiting=np.full(span, len(scheduler.waiting)), num_preempted=zeros,
        token_states=token_states, reserved=reserved,
        internal_over_reservation=np.full(span, base.internal_over_reservation),
        internal_rounding=rounding,
        external_fragmentation=free if plan.memory_blocked else zeros,
        idle=zeros if plan.memory_blocked else free,
        logical_tokens=base.logical_tokens + appended, allocated_slots=allocated,
        largest_free_extent=largest_free, cached_free_slots=cached_free,
    )
    return float(ends[-1])


def _paged_partial(written: np.ndarray, finals: np.ndarray, bs: int) -> tuple[np.ndarray, np.ndarray]:
    """Reserved and rounding slots of each sequence's partial last block (0 when full)."""
    fill = written % bs
    last_start = written - fill
    target = np.minimum(bs, finals - last_start)
    partial = fill > 0
    return np.where(partial, target - fill, 0), np.where(partial, bs - target, 0)
