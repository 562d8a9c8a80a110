"""Advance many pure-decode steps at once, keeping every per-step figure exact.

Between events (a preemption, a prefill, a copy-on-write, a finish, an arrival at
an empty queue, a waiting request becoming admissible) every running sequence only
appends one token per step, and the scheduler's decisions cannot change: memory
only shrinks, so a request that does not fit stays out, and the token budget and
sequence count stay as they are (``Scheduler.admission_while_decoding``). Requests
that arrive while others wait queue behind the waiting head, which stays refused:
they do not end the span (only its ``num_waiting`` column counts them). The sim
executor can therefore charge K such steps in closed form, append K tokens per
sequence in one manager call, and write K step rows computed from per-sequence
formulas, instead of looping K times.

A span may end with the step in which requests finish: their last tokens are
appended and they are freed in running order (as ``Scheduler.postprocess`` frees
them); that step's memory row, like every step's, is the memory it ran with (before
those frees).
When admission stays closed after the frees (nothing waits, or the waiting head
still does not fit), the next span starts right away (the engine calls again).

``tests/test_engine_fast_forward.py`` checks that every step row, clock included,
equals the step-by-step run bit for bit (block ids may differ: a bulk append takes
a sequence's new blocks together, but no figure depends on which ids they are).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate

import numpy as np

from pagebench.allocators.base import PagedBulkDecode
from harness.engine.fast_forward_hybrid import hybrid_fast_forward
from harness.engine.plan import StepPlan
from harness.engine.scheduler import Scheduler
from harness.engine.sequence import Sequence, SequenceGroup, decode_synthetic
from harness.engine.spans import MAX_SPAN, PRICE_WINDOW, Advance, Arrivals, DecodingBatch
from harness.metrics.summaries import RunRecorder

# Shorter spans run step by step (1: even one bulk step costs less than a scheduled one).
MIN_SPAN = 1


def plan_allows_fast_forward(plan: StepPlan, scheduler: Scheduler) -> bool:
    """Cheap checks on the step that just ran: can steady decode steps follow it?

    The step itself may have admitted and prefilled requests, or preempted some by
    recompute; ``fast_forward`` then checks that every running sequence is decoding,
    and that admission stays closed.
    """
    return not (plan.swap_in or plan.swap_out or plan.copies or scheduler.swapped
                or scheduler._pending_copies or not scheduler.num_running_seqs)


def fast_forward(scheduler: Scheduler, executor, recorder: RunRecorder, freed_memory: bool,
                 now: float, arrivals: Arrivals) -> Advance | None:
    """Run as many steady decode steps as possible in bulk, or return None (nothing done).

    ``freed_memory``: a request finished since the last ``schedule()`` (see
    ``Scheduler.admission_while_decoding``). When requests wait, new arrivals join the
    queue behind its head and cannot be admitted before it: they do not end the span
    (the step rows count them as waiting; the engine queues them afterwards). When
    none waits, the span ends with the step in which the next request arrives.
    """
    queue_behind = bool(scheduler.waiting)
    next_arrival_time = None if queue_behind else arrivals.next_time
    if next_arrival_time is not None and next_arrival_time <= now:
        return None  # it joins the queue before the next schedule
    manager = scheduler.manager
    num_seqs = scheduler.num_running_seqs
    if not num_seqs or num_seqs > scheduler.spec.max_num_batched_tokens:
        return None  # the token budget would skip some sequences
    bulk = manager.capabilities.bulk_decode
    if bulk is None:
        return None  # no closed form for this manager: step by step
    if bulk == "hybrid":  # its steps one by one, without the scheduler
        return hybrid_fast_forward(scheduler, executor, recorder, now, arrivals)
    paged = bulk == "paged"
    # NOTE: after a finish the waiting head often fits (then asking first saves the walk
    # over every sequence); otherwise ask once they all decode: a prefilling sequence is
    # the cheaper answer
    memory_blocked = scheduler.admission_while_decoding(freed_memory) if freed_memory else False
    if memory_blocked is None:
        return None  # the next step may admit
    batch = DecodingBatch.of(scheduler)
    if batch is None:
        return None  # beams, or a sequence still prefilling
    seqs, computed = batch.seqs, batch.computed
    remaining_list, workload_tokens = batch.remaining, batch.workload_tokens
    num_seqs = len(seqs)
    if not freed_memory:
        memory_blocked = scheduler.admission_while_decoding(freed_memory)
        if memory_blocked is None:
            return None  # the next step may admit
    if paged and manager.has_shared_partial_blocks:
        if not all(manager.can_append_without_copy(s.seq_id) for s in seqs):
            return None  # a shared partial block must be copied first
    first_finish = min(remaining_list)
    span = min(first_finish, MAX_SPAN)
    sum_positions = sum(computed)
    # Price the steps; most spans end at an arrival well before MAX_SPAN, so try a short
    # window first.
    priced = min(span, PRICE_WINDOW) if next_arrival_time is not None else span
    while True:
        durations = executor.decode_durations(sum_positions, num_seqs, priced, computed)  # [priced]
        # [priced + 1]: each step's start, then the last one's end; summed in order, like
        # the loop's clock
        clock = list(accumulate(durations, initial=float(now)))
        arrived = next_arrival_time is not None and clock[-1] >= next_arrival_time
        if arrived or priced == span:
            break
        priced = span
    if arrived:  # the step the arrival lands in: the first to end at or after it
        span = bisect_left(clock, next_arrival_time, 1)  # (the clock never goes back)

    if paged:  # per step: the blocks it takes, and how reserved and rounding slots move
        bs = manager.block_size
        news, reserved_moves, rounding_moves, block_steps = _paged_span_events(
            computed, remaining_list, bs, span)
        taken = list(accumulate(news))  # [span] blocks taken by the end of each step
        free_blocks = manager.num_free_blocks
        if taken[-1] > free_blocks:
            # the next step would preempt (0: the first one would): run it normally
            span = bisect_right(taken, free_blocks)
            arrived = False
            if span < MIN_SPAN:
                return None
    # NOTE: only tokens the workload gives (Request.output_token_ids, e.g. chat answers that
    # a later turn's prompt repeats) can form a block whose key another prompt (or another
    # sequence) has too: the synthetic ones are unique to their sequence and position.
    keyed = paged and manager.capabilities.prefix_cache
    shared_keys = workload_tokens if keyed else []
    if shared_keys and scheduler.waiting:
        kv_tokens = batch.kv_tokens(span)
        grow = _first_prefix_growth(scheduler, manager, seqs, shared_keys, kv_tokens, computed, bs)
        if grow is not None and grow <= span:
            span = grow - 1  # that step's schedule may admit: run it normally
            arrived = False
            if span < MIN_SPAN:
                return None
    durations, starts, end_time = durations[:span], clock[:span], clock[span]
    finishing = span == first_finish  # the last step finishes requests

    # The span's step rows, in closed form from the breakdown now: each column one number
    # (every step's), a range or a list (``RunRecorder.record_span``).
    base = manager.breakdown(memory_blocked)
    last = num_seqs * span  # tokens appended by the end of the span, all sequences
    token_states = range(base.token_states + num_seqs, base.token_states + last + 1, num_seqs)
    logical = range(base.logical_tokens + num_seqs, base.logical_tokens + last + 1, num_seqs)
    if paged:
        taken = taken[:span]
        allocated = [base.allocated_slots + bs * count for count in taken]
        reserved = list(accumulate(reserved_moves[:span], initial=base.reserved))[1:]
        rounding = list(accumulate(rounding_moves[:span], initial=base.internal_rounding))[1:]
        flags = manager.cached_flags_at_head(taken[-1])  # evicted in queue order
        cached_popped = list(accumulate(flags, initial=0))
        cached_free = [base.cached_free_slots - bs * cached_popped[count] for count in taken]
        free = [base.capacity_slots - slots for slots in allocated]
        largest_free = free
    else:
        allocated = base.allocated_slots
        reserved = range(base.reserved - num_seqs, base.reserved - last - 1, -num_seqs)
        rounding = base.internal_rounding
        cached_free = base.cached_free_slots
        largest_free = base.largest_free_extent
        free = base.capacity_slots - base.allocated_slots
    if queue_behind:  # arrivals join before each step starts
        num_waiting = arrivals.joined_by(starts, len(scheduler.waiting))
    else:
        num_waiting = len(scheduler.waiting)
    row = (  # STEP_COLUMNS but step, in order (a tuple: one per span)
        starts, durations,  # time_s, duration_s
        num_seqs, num_seqs, 0,  # num_seqs, num_batched_tokens (one token each), num_prefill_tokens
        num_waiting, 0,  # num_waiting, num_preempted
        token_states, reserved, base.internal_over_reservation, rounding,
        base.internal_page_padding,
        free if memory_blocked else 0, 0 if memory_blocked else free,  # external_fragmentation, idle
        logical, allocated, largest_free, cached_free,  # logical_tokens .. cached_free_slots
    )

    # Commit: the KV appends (each step's ``kv_span``), and the sampled tokens.
    executor.decoded_span(sum_positions, num_seqs, span, computed)
    if shared_keys or (keyed and not manager.capabilities.token_sources):
        kv_tokens = batch.kv_tokens(span)
    else:  # NOTE: only the count is read (the ids keyed are read from token sources)
        kv_tokens = [range(span)] * num_seqs
    decode_synthetic(seqs, span)
    residency = manager.pool.residency if paged and manager.capabilities.block_residency else None
    if shared_keys:
        _commit_in_step_order(manager, seqs, kv_tokens, _written(computed, span), bs, residency,
                              starts, end_time)
    # NOTE: a contiguous manager appends to all the sequences it holds in O(1), when they
    # are these (none swapped out: plan_allows_fast_forward)
    elif paged or not manager.advance_all(span, num_seqs):
        timed = residency is not None and taken[-1] > 0  # (no block taken: no time to give)
        if timed:  # the blocks' times, as the step-by-step run takes them
            residency.span(*_allocation_times(news, block_steps, starts))
        if manager.append_batch([seq.seq_id for seq in seqs], kv_tokens, []) < num_seqs:
            # NOTE: every new key is unique: the order of the appends does not matter
            raise RuntimeError("fast-forward: append failed after the memory check")  # invariant
        if residency is not None:
            residency.end_span(end_time)

    finished: list[SequenceGroup] = []
    if finishing:  # the groups of the sequences done now (all of a group's: no beams here)
        finished = scheduler.finish_decoded(end_time, _finishing_groups(seqs, remaining_list, span))
    recorder.record_span(span, row)
    may_continue = finishing and bool(finished) and not arrived and scheduler.num_running_seqs > 0
    return Advance(end_time, finished, may_continue)


def _finishing_groups(seqs: list[Sequence], remaining: list[int], span: int
                      ) -> list[SequenceGroup]:
    """The groups of the sequences with ``span`` tokens ``remaining``, in running order
    (each once).

    NOTE: a span usually finishes one or two of some fifty sequences: ``list.index`` finds
    them at C speed.
    """
    groups: dict[SequenceGroup, None] = {}
    at = -1
    for _ in range(remaining.count(span)):
        at = remaining.index(span, at + 1)
        groups[seqs[at].group] = None
    return list(groups)



def _first_prefix_growth(scheduler: Scheduler, manager: PagedBulkDecode, seqs: list[Sequence],
                         candidates: list[int], kv_tokens: list[range | list[int]],
                         positions: list[int], bs: int) -> int | None:
    """The first step (1-based) of the span in which one of the ``candidates`` sequences
    fills a block that extends the waiting head's cached prefix, or None.

    NOTE: a longer cached prefix lowers what the head needs (memory and token budget),
    so from that step on the scheduler may admit it.
    """
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


def _commit_in_step_order(manager: PagedBulkDecode, seqs: list[Sequence],
                          span_tokens: list[range | list[int]], written: np.ndarray,
                          bs: int, residency=None, starts: list[float] | None = None,
                          end_time: float = 0.0) -> None:
    """Append each sequence's span tokens so that every block allocation (which may evict
    a cached block) and every registration of a filled block happens in the order the
    step-by-step run does them: by step, then in running order.

    NOTE: when two blocks get the same key that order decides which one keeps it (one
    block per key), and whether a cached block holding it is evicted first. Between two
    such events of a sequence its appends stay inside its last block, so one ``append``
    call per event (plus one for the rest) reproduces the order exactly. With a
    ``residency`` log its clock is each step's start (``starts``) as its blocks are taken,
    then the span's end.
    """
    # append j (1-based) writes position written[:, j-1] - 1: a new block when that
    # position starts one, a full block when written is a multiple of bs
    events = ((written - 1) % bs == 0) | (written % bs == 0)  # [num_seqs, span]
    steps, order = np.nonzero(events.T)  # by step, then by running order
    done = [0] * len(seqs)
    append = manager.append
    for j, i in zip(steps.tolist(), order.tolist()):
        if residency is not None:
            residency.now = starts[j]
        upto = j + 1
        if append(seqs[i].seq_id, span_tokens[i][done[i]:upto]) is None:
            raise RuntimeError("fast-forward: append failed after the memory check")  # invariant
        done[i] = upto
    for seq, tokens, count in zip(seqs, span_tokens, done):
        if count < len(tokens):
            append(seq.seq_id, tokens[count:])
    if residency is not None:
        residency.now = end_time


def _written(computed: list[int], span: int) -> np.ndarray:
    """[num_seqs, span]: each sequence's KV slots written after each step of the span (only
    where a path needs them as an array: shared keys, block residency)."""
    return (np.array(computed, dtype=np.int64)[:, None]
            + np.arange(1, span + 1, dtype=np.int64)[None, :])


def _allocation_times(news: list[int], block_steps: list[int], starts: list[float]
                      ) -> tuple[list[float], list[float]]:
    """The start times of a span's block allocations (an append that starts a block), in
    step order (then running order: the step-by-step run's pops) and in sequence order
    (``append_batch``'s: each sequence's blocks by step). ``news`` and ``block_steps``:
    ``_paged_span_events``' (of a span that may have been cut to ``len(starts)`` steps
    since). In Python: a span is a few steps."""
    span = len(starts)
    in_steps = [start for start, count in zip(starts, news) for _ in range(count)]
    by_sequence = [starts[j] for j in block_steps if j < span]
    return in_steps, by_sequence


def _paged_span_events(computed: list[int], remaining: list[int], bs: int, span: int
                       ) -> tuple[list[int], list[int], list[int], list[int]]:
    """Per step of a span (``[span]`` each): the blocks the sequences take, and the change
    of their reserved and rounding slots (those of each one's partial last block); then
    the step (0-based) of each block taken, sequence by sequence.

    A sequence at ``c`` tokens with ``left`` to generate takes a block at the appends that
    start one: steps ``(-c) % bs + 1``, then every ``bs``. There its partial block's target
    becomes ``t = min(bs, left - j)`` (0-based step ``j``): reserved grows by ``t - 1`` (one
    slot written) and rounding by ``bs - t``, which is 0 but in its last block. At every
    other step one reserved slot is written (a block it fills had target ``bs``: reserved
    1 -> 0). So a step's reserved change is ``bs`` per block taken, less its rounding, less
    one slot per sequence. Python ints, O(sequences + new blocks): spans are a few steps,
    where numpy's per-call cost dominated.

    NOTE: a ``while`` over a sequence's blocks, not a ``range``: most sequences take none
    in a span, and building the range cost more than the test (about 40% of this walk).
    """
    news = [0] * span
    rounding = [0] * span
    block_steps: list[int] = []
    for c, left in zip(computed, remaining):
        j = (-c) % bs  # the first block's 0-based step: append j + 1 writes position c + j
        while j < span:  # (most sequences: none, a span is shorter than a block)
            news[j] += 1
            block_steps.append(j)
            if left - j < bs:  # its last block: the target is what it has left
                rounding[j] += bs - left + j
            j += bs
    num_seqs = len(computed)
    reserved = [bs * count - rounded - num_seqs for count, rounded in zip(news, rounding)]
    return news, reserved, rounding, block_steps
