"""Advance many pure-decode steps at once, keeping every per-step figure exact.

Between events (an arrival, a preemption, a prefill, a copy-on-write, a waiting
request becoming admissible) every running sequence only appends one token per
step, and the scheduler's decisions cannot change: memory only shrinks, so a
request refused for memory stays refused, and the token budget and sequence count
stay as they are (``Scheduler.admission_blocked_while_decoding``). The sim executor
can therefore charge K such steps in closed form, append K tokens per sequence in
one manager call, and write K step rows computed from per-sequence formulas,
instead of looping K times.

A span may end with the step in which requests finish: their last tokens are
appended, they are freed in running order (as ``Scheduler.postprocess`` frees
them) and that step's memory figures are read from the manager after the frees.
When nothing waits, the next span starts right away (the engine calls again).

``tests/test_engine_fast_forward.py`` checks that every step row equals the
step-by-step run (block ids may differ: a bulk append takes a sequence's new
blocks together, but no figure depends on which ids they are).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from allocators.contiguous import ContiguousKVCacheManager
from allocators.paged import PagedKVCacheManager
from harness.engine.scheduler import Scheduler, StepPlan
from harness.engine.sequence import Sequence, SequenceGroup
from harness.metrics import MEMORY_CATEGORIES, RunRecorder

# Fewer steps than this are not worth the setup: run them one by one.
MIN_SPAN = 2
MAX_SPAN = 4096
_BREAKDOWN_COLUMNS = (*MEMORY_CATEGORIES, "logical_tokens", "allocated_slots",
                      "largest_free_extent", "cached_free_slots")


@dataclass
class Advance:
    """What one ``fast_forward`` call did."""

    now: float  # the clock after the last step of the span
    finished: list[SequenceGroup]  # groups that finished in the last step, in running order
    may_continue: bool  # the span ended only because requests finished and nothing waits


def plan_allows_fast_forward(plan: StepPlan, scheduler: Scheduler, finished_any: bool) -> bool:
    """Cheap checks on the step that just ran: can steady decode steps follow it?

    The step itself may have admitted and prefilled requests; ``fast_forward`` then
    checks that every running sequence is decoding.
    """
    if (plan.num_preempted or plan.swap_in or plan.swap_out or plan.copies
            or scheduler.swapped or scheduler._pending_copies or not scheduler.num_running_seqs):
        return False
    return scheduler.admission_blocked_while_decoding(freed_memory=finished_any)


def fast_forward(scheduler: Scheduler, executor, recorder: RunRecorder, memory_blocked: bool,
                 now: float, next_arrival_time: float | None) -> Advance | None:
    """Run as many steady decode steps as possible in bulk, or return None (nothing done)."""
    manager = scheduler.manager
    seqs: list[Sequence] = []
    for group in scheduler.running:
        if group.request.beam_width > 1:
            return None  # beams are re-selected every step
        seqs.extend(group.seqs)
    num_seqs = len(seqs)
    if not num_seqs or num_seqs > scheduler.spec.max_num_batched_tokens:
        return None  # the token budget would skip some sequences
    generated = [len(s.generated) for s in seqs]
    prompt_lens = [len(s.prompt) for s in seqs]
    computed = [s.num_computed for s in seqs]
    if any(c != p + g - 1 for c, p, g in zip(computed, prompt_lens, generated)):
        return None  # a sequence is still prefilling (or has not sampled yet)
    positions = np.array(computed, dtype=np.int64)
    output_lens = np.array([s.group.request.output_len for s in seqs], dtype=np.int64)
    remaining = output_lens - np.array(generated, dtype=np.int64)  # steps until each finishes
    first_finish = int(remaining.min())
    span = min(first_finish, MAX_SPAN)
    if span < MIN_SPAN:
        return None
    finals = positions + remaining  # KV slots when each ends (= final_len)
    steps = np.arange(1, span + 1, dtype=np.int64)  # tokens appended after each step
    written = positions[:, None] + steps[None, :]  # [num_seqs, span]

    paged = isinstance(manager, PagedKVCacheManager)
    if paged:
        bs = manager.block_size
        if not all(manager.can_append_without_copy(s.seq_id) for s in seqs):
            return None  # a shared partial block must be copied first
        start_blocks = -(-positions // bs)  # [num_seqs]
        blocks = -(-written // bs)  # [num_seqs, span]
        new_blocks = (blocks - start_blocks[:, None]).sum(axis=0)  # [span]
        fits = new_blocks <= manager.num_free_blocks
        if not fits[-1]:
            span = int(fits.argmin())  # the next step would preempt: run it normally
            if span < MIN_SPAN:
                return None
    elif not isinstance(manager, ContiguousKVCacheManager):
        return None

    durations = executor.decode_durations(int(positions.sum()), num_seqs, span)  # [span]
    ends = np.cumsum(np.concatenate(([now], durations)))[1:]  # sequential, like the loop
    arrived = False
    if next_arrival_time is not None and ends[span - 1] >= next_arrival_time:
        span = int(np.argmax(ends >= next_arrival_time)) + 1  # the step the arrival lands in
        arrived = True
        if span < MIN_SPAN:
            return None
    # The span's tokens: sampled ones, and the ones whose KV each step writes.
    new_tokens = [seq.synthetic_tokens(first, span) for seq, first in zip(seqs, generated)]
    kv_tokens = [[seq.generated[-1], *tokens[:-1]] for seq, tokens in zip(seqs, new_tokens)]
    if paged and manager.enable_prefix_caching and scheduler.waiting:
        grow = _first_prefix_growth(scheduler, manager, seqs, kv_tokens, positions, bs)
        if grow is not None and grow <= span:
            span = grow - 1  # that step's schedule may admit: run it normally
            arrived = False
            if span < MIN_SPAN:
                return None
    durations, ends, steps, written = durations[:span], ends[:span], steps[:span], written[:, :span]
    finishing = span == first_finish  # the last step finishes requests

    base = manager.breakdown(memory_blocked)
    appended = steps * num_seqs  # [span] tokens appended so far, all sequences
    if paged:
        blocks = blocks[:, :span]
        taken = (blocks - start_blocks[:, None]).sum(axis=0)  # [span] blocks taken so far
        allocated = base.allocated_slots + bs * taken
        reserved_now, rounding_now = _paged_partial(positions, finals, bs)
        reserved_after, rounding_after = _paged_partial(written, finals[:, None], bs)
        reserved = base.reserved + (reserved_after.sum(axis=0) - reserved_now.sum())
        rounding = base.internal_rounding + (rounding_after.sum(axis=0) - rounding_now.sum())
        flags = manager.pool.cached_flags_at_head(int(taken[-1]))  # evicted in queue order
        cached_popped = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
        cached_free = base.cached_free_slots - bs * cached_popped[taken]
        largest_free = base.capacity_slots - allocated
    else:
        allocated = np.full(span, base.allocated_slots, dtype=np.int64)
        reserved = base.reserved - appended
        rounding = np.full(span, base.internal_rounding, dtype=np.int64)
        cached_free = np.full(span, base.cached_free_slots, dtype=np.int64)
        largest_free = np.full(span, base.largest_free_extent, dtype=np.int64)
    free = base.capacity_slots - allocated
    zeros = np.zeros(span, dtype=np.int64)
    columns = dict(
        time_s=ends - durations, duration_s=durations, num_seqs=np.full(span, num_seqs),
        num_batched_tokens=np.full(span, num_seqs), num_prefill_tokens=zeros,
        num_waiting=np.full(span, len(scheduler.waiting)), num_preempted=zeros,
        token_states=base.token_states + appended, reserved=reserved,
        internal_over_reservation=np.full(span, base.internal_over_reservation),
        internal_rounding=rounding,
        external_fragmentation=free if memory_blocked else zeros,
        idle=zeros if memory_blocked else free,
        logical_tokens=base.logical_tokens + appended, allocated_slots=allocated,
        largest_free_extent=largest_free, cached_free_slots=cached_free,
    )

    # Commit: the sampled tokens, and the KV appends.
    span_tokens = [tokens[:span] for tokens in kv_tokens]
    for seq, tokens in zip(seqs, new_tokens):
        seq.generated.extend(tokens[:span])
    if paged and manager.enable_prefix_caching:
        _commit_in_step_order(manager, seqs, span_tokens, written, bs)
    else:  # nothing depends on the order: one manager call per sequence
        append = manager.append
        for seq, tokens in zip(seqs, span_tokens):
            if append(seq.seq_id, tokens) is None:
                raise RuntimeError("fast-forward: append failed after the memory check")  # invariant
    for seq, start in zip(seqs, computed):
        seq.num_computed = start + span

    finished: list[SequenceGroup] = []
    end_time = float(ends[-1])
    if finishing:
        finished = scheduler.finish_decoded(end_time)
        if finished:  # that step's memory is read after the frees, as the loop reads it
            after = manager.breakdown(memory_blocked)
            for name in _BREAKDOWN_COLUMNS:
                column = columns[name] = np.array(columns[name], dtype=np.int64)
                column[-1] = getattr(after, name)
    recorder.record_steps(**columns)
    may_continue = (finishing and bool(finished) and not arrived and not scheduler.waiting
                    and scheduler.num_running_seqs > 0)
    return Advance(end_time, finished, may_continue)


def _first_prefix_growth(scheduler: Scheduler, manager: PagedKVCacheManager, seqs: list[Sequence],
                         kv_tokens: list[list[int]], positions: np.ndarray, bs: int) -> int | None:
    """The first step (1-based) of the span in which a running sequence fills a block that
    extends the waiting head's cached prefix, or None.

    NOTE: a longer cached prefix lowers what the head needs (memory and token budget),
    so from that step on the scheduler may admit it. Only tokens given by the workload
    (``Request.output_token_ids``, e.g. chat turns that a later turn's prompt repeats)
    can reappear in another prompt: the synthetic ones are unique to their sequence.
    """
    candidates = [i for i, seq in enumerate(seqs)
                  if seq.lineage == 0 and seq.group.request.output_token_ids is not None]
    if not candidates:
        return None
    head = scheduler.waiting[0]
    if head.seqs:
        seq = head.seqs[0]
        frontier = manager.prefix_frontier_key(seq.token_ids(0, seq.num_tokens))
    else:
        frontier = manager.prefix_frontier_key(head.request.prompt_token_ids)
    if frontier is None:
        return None
    first = None
    for i in candidates:
        for j, key in enumerate(manager.filled_block_keys(seqs[i].seq_id, kv_tokens[i])):
            if key == frontier:
                step = (j + 1) * bs - int(positions[i]) % bs  # the append that fills block j
                first = step if first is None else min(first, step)
                break
    return first


def _commit_in_step_order(manager: PagedKVCacheManager, seqs: list[Sequence],
                          span_tokens: list[list[int]], written: np.ndarray, bs: int) -> None:
    """Append each sequence's span tokens so that every block allocation (which may evict
    a cached block) and every registration of a filled block happens in the order the
    step-by-step run does them: by step, then in running order.

    NOTE: with prefix caching that order decides which block keeps a key (one block per
    key) and which cached blocks are evicted first. Between two such events of a
    sequence its appends stay inside its last block, so one ``append`` call per event
    (plus one for the rest) reproduces the order exactly.
    """
    # append j (1-based) writes position written[:, j-1] - 1: a new block when that
    # position starts one, a full block when written is a multiple of bs
    events = ((written - 1) % bs == 0) | (written % bs == 0)  # [num_seqs, span]
    steps, order = np.nonzero(events.T)  # by step, then by running order
    done = [0] * len(seqs)
    append = manager.append
    for j, i in zip(steps.tolist(), order.tolist()):
        upto = j + 1
        if append(seqs[i].seq_id, span_tokens[i][done[i]:upto]) is None:
            raise RuntimeError("fast-forward: append failed after the memory check")  # invariant
        done[i] = upto
    for seq, tokens, count in zip(seqs, span_tokens, done):
        if count < len(tokens):
            append(seq.seq_id, tokens[count:])


def _paged_partial(written: np.ndarray, finals: np.ndarray, bs: int) -> tuple[np.ndarray, np.ndarray]:
    """Reserved and rounding slots of each sequence's partial last block (0 when full)."""
    fill = written % bs
    last_start = written - fill
    target = np.minimum(bs, finals - last_start)
    partial = fill > 0
    return np.where(partial, target - fill, 0), np.where(partial, bs - target, 0)
