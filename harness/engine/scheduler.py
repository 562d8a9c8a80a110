"""Iteration-level (continuous-batching) scheduler with preemption.

The scheduler owns the queues and the KV manager; it never touches tensors.
Each ``schedule()`` returns a ``StepPlan``: which token ranges of which
sequences run this step, and the block copies/swaps to execute first.

Policy (vLLM-style, FCFS):
  1. running groups, oldest arrival first, each get their next chunk (one token
     per sequence when decoding). When memory runs out, the newest running group
     is preempted (recompute, or swap for single-sequence groups), until the
     current group fits or is itself the newest;
  2. if nothing was preempted, swapped groups come back in FCFS order;
  3. if nothing was preempted and none waits in swap, waiting groups are
     admitted in FCFS order (head-of-line blocking) within ``max_num_seqs``,
     ``max_num_batched_tokens`` and memory. ``scheduling=static`` admits only
     when nothing is running: the no-continuous-batching control.

Multi-sequence groups (parallel sampling, beam search) are admitted whole: the
prompt is prefilled once and shared by every sequence (forked at admission);
they are never chunked and are preempted by restarting from scratch.
"""

from __future__ import annotations

import random
from array import array
from bisect import insort_right
from collections import deque
from operator import attrgetter
from typing import TYPE_CHECKING

from pagebench.allocators.base import KVCacheManager
from harness.config.specs import EngineSpec
from harness.engine.plan import ScheduledChunk, StepPlan
from harness.engine.sequence import SYNTHETIC_TOKEN_BASE, Sequence, SequenceGroup

if TYPE_CHECKING:
    import numpy as np

_ORDER = attrgetter("order")  # the bisection's key, read in C


class Scheduler:
    """Queues + KV manager; emits step plans and applies their outcome."""

    def __init__(self, manager: KVCacheManager, spec: EngineSpec, *, seed: int = 0) -> None:
        self.manager = manager
        self.spec = spec
        self.seed = seed
        self.swap_allowed = spec.preemption == "swap"
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []  # sorted by arrival order
        self.swapped: deque[SequenceGroup] = deque()
        self.num_running_seqs = 0
        self._next_seq_id = 0
        self._pending_copies: list[tuple[int, int]] = []
        self._beam_rngs: dict[int, random.Random] = {}
        self._memory_refused: SequenceGroup | None = None  # waiting head the last step refused for memory
        # counters for results
        self.num_preemptions = 0
        self.num_swaps = 0
        self.prompt_tokens_queried = 0
        self.prompt_tokens_cached = 0
        self.readmission_tokens_cached = 0  # of those, hits of requests re-admitted after a preemption
        self.offload_tokens_cached = {"cpu": 0, "disk": 0}  # of those, loaded from each offload tier
        # request id -> [cpu, disk] slots it loaded before its first token (its TTFT's loads)
        self.offload_loads: dict[int, list[int]] = {}
        # preemptions recomputed although preemption=swap, by why
        self.swap_fallbacks = {"multi_sequence_group": 0, "cpu_swap_space_full": 0}
        self._maps_pages = manager.capabilities.maps_pages
        # one decode token per sequence in one manager call (Capabilities.batched_decode)
        self._batch_decode = manager.append_decode if manager.capabilities.batched_decode else None
        # whether append_decode reads the token ids (Capabilities.reads_decode_tokens): if
        # not, _decode_run builds none and passes None
        self._decode_tokens = manager.capabilities.reads_decode_tokens
        # whether the manager reads token ids from each sequence (Capabilities.token_sources)
        self._token_sources = manager.capabilities.token_sources
        # a contiguous closed form appends one token to every sequence it holds in O(1)
        self._advance_all = (manager.advance_all if manager.capabilities.bulk_decode == "contiguous"
                             else None)
        self._pages_seen = (0, 0)  # (mapped, unmapped) pages counted into earlier plans
        # The simulated time the next schedule()'s step starts at (the engine sets it): a
        # group that produces no token in that step records it (SequenceGroup.token_breaks)
        self.step_start = 0.0
        # the block pool's residency log (pagebench.allocators.residency), whose clock this
        # keeps: a step is scheduled at the later of the last step's end and the arrivals
        # queued since, and postprocessed at its end
        self._residency = (manager.pool.residency if manager.capabilities.block_residency
                           else None)

    # ------------------------------------------------------------------ queues
    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)
        if self._residency is not None and group.request.arrival_time > self._residency.now:
            self._residency.now = group.request.arrival_time

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def _new_seq(self, group: SequenceGroup, generated: array | None = None) -> Sequence:
        seq = Sequence(self._next_seq_id, group, group.next_lineage, generated)
        self._next_seq_id += 1
        group.next_lineage += 1
        return seq

    def _insert_running(self, group: SequenceGroup) -> None:
        """Insert ``group`` into ``running`` by ``SequenceGroup.order``, after its equals."""
        insort_right(self.running, group, key=_ORDER)

    # --------------------------------------------------------------- schedule
    def schedule(self) -> StepPlan:
        plan = StepPlan(copies=self._pending_copies)
        self._pending_copies = []
        self._memory_refused = None
        self._budget = self.spec.max_num_batched_tokens
        self._scheduled: set[int] = set()
        static_admission_open = not self.running and not self.swapped

        batch_decode = self._batch_decode
        index = 0
        while index < len(self.running):
            if batch_decode is not None:
                # A run of single-sequence groups decoding one token each, in one manager
                # call: exactly what _extend_group does for each of them in turn.
                index = self._decode_run(index, plan, batch_decode)
                if index >= len(self.running):
                    break
            group = self.running[index]
            if self._extend_group(group, plan):
                index += 1
                continue
            victim = self.running[-1]
            self._preempt(victim, plan)
            plan.memory_blocked = True
            if victim is group:
                break

        if plan.num_preempted == 0 and self.swapped:
            self._swap_in(plan)
        if plan.num_preempted == 0 and not self.swapped:
            if self.spec.scheduling == "continuous" or static_admission_open:
                self._admit(plan)
        if self._maps_pages:  # the pages mapped (unmapped) since the last plan: this step's
            stats = self.manager.stats
            plan.num_mapped_pages = stats.mapped_pages - self._pages_seen[0]
            plan.num_unmapped_pages = stats.unmapped_pages - self._pages_seen[1]
            self._pages_seen = (stats.mapped_pages, stats.unmapped_pages)
        return plan

    def _decode_run(self, index: int, plan: StepPlan, batch_decode) -> int:
        """Schedule the decode of the single-sequence groups from ``running[index]`` on
        that need exactly one token (as many as the token budget allows), with one
        ``append_decode`` call, as the plan's compact decodes. Returns the index of the
        first group not scheduled: the next to go through ``_extend_group`` (it may be the
        one that ran out of memory).

        NOTE: these groups are not added to ``_scheduled``: a single-sequence group is
        never revisited in the same step (a preemption victim is always a later group).
        The token ids are built only for a manager that reads them
        (``Capabilities.reads_decode_tokens``); the others get None. A contiguous closed
        form (``Capabilities.bulk_decode``) advances a run of all its sequences at once.
        """
        seqs: list[Sequence] = []
        tokens: list[int] | None = [] if self._decode_tokens else None  # each one's last token
        starts: list[int] = []
        prompt_ends = 0  # sequences whose one token is their prompt's last (nothing generated)
        base = SYNTHETIC_TOKEN_BASE
        # NOTE: the loop runs once per decoding sequence; ``xs.append(x)`` is cheaper than
        # a bound ``append`` kept in a local on Python 3.11 (a specialised call)
        for group in self.running[index:index + self._budget]:
            try:
                (seq,) = group.seqs  # NOTE: a multi-sequence group raises (no len() per group)
            except ValueError:
                break
            g = seq.num_generated
            start = seq.num_computed
            if start != seq.prompt_len + g - 1:
                break
            seqs.append(seq)
            if not g:
                prompt_ends += 1
            if tokens is not None:  # its last token (Sequence.token_at, inlined: none stored)
                if not g:
                    tokens.append(int(seq.prompt[-1]))
                elif (offset := seq.synthetic_offset) >= 0 and not seq.stored:
                    tokens.append(base + (offset + g - 1) % base)
                else:
                    tokens.append(seq.token_at(g - 1))
            starts.append(start)
        if not seqs:
            return index
        advance_all = self._advance_all
        if advance_all is not None and advance_all(1, len(seqs)):
            # NOTE: the run is every sequence the manager holds (as many, none swapped out),
            # and none passes its final_len (it has tokens left to generate): exactly
            # append_decode's appends, without the walk
            done = len(seqs)
        else:
            done = batch_decode([seq.seq_id for seq in seqs], tokens, plan.copies)
        if done:
            if done < len(seqs):
                del seqs[done:], starts[done:]
                if prompt_ends:
                    prompt_ends = sum(1 for seq in seqs if not seq.num_generated)
            plan.add_decodes(seqs, starts, prompt_ends)
            self._budget -= done
        return index + done

    def _extend_group(self, group: SequenceGroup, plan: StepPlan) -> bool:
        """Schedule each sequence's next chunk; False when memory ran out."""
        chunked = self.spec.chunked_prefill
        for seq in group.seqs:
            if seq.seq_id in self._scheduled:
                continue
            remaining = seq.num_tokens - seq.num_computed
            count = min(remaining, self._budget) if chunked else remaining
            if count <= 0 or count > self._budget:
                self._break_tokens(group)
                continue  # token budget spent: this sequence waits a step
            start = seq.num_computed
            copies = self.manager.append(seq.seq_id, seq.token_ids(start, start + count))
            if copies is None:
                return False
            plan.copies.extend(copies)
            self._add_chunk(plan, seq, start, start + count)
        return True

    def _break_tokens(self, group: SequenceGroup) -> None:
        """Record that ``group`` produces no token in the step being scheduled (it is
        preempted, or waits for the token budget): ``SequenceGroup.token_breaks``. Only
        single-sequence groups that have generated tokens, once per token count (a break
        with no token since the last one adds nothing)."""
        if group.width != 1 or not group.seqs:
            return
        count = group.seqs[0].num_generated
        if not count:
            return
        breaks = group.token_breaks
        if breaks is None:
            group.token_breaks = [(self.step_start, count)]
        elif breaks[-1][1] != count:
            breaks.append((self.step_start, count))

    def _add_chunk(self, plan: StepPlan, seq: Sequence, start: int, end: int,
                   members: tuple[Sequence, ...] = ()) -> None:
        """Schedule positions [start, end) of ``seq`` (shared by ``members``) this step."""
        plan.add_chunk(ScheduledChunk(seq, start, end, members))
        self._scheduled.add(seq.seq_id)
        self._budget -= end - start

    def _unschedule(self, group: SequenceGroup, plan: StepPlan) -> None:
        ids = {seq.seq_id for seq in group.seqs}
        if not ids & self._scheduled:
            return
        self._budget += plan.remove_chunks(ids)
        self._scheduled -= ids

    def _preempt(self, group: SequenceGroup, plan: StepPlan) -> None:
        """Evict ``group`` from the running set: swap it out, or free it for recompute."""
        self._break_tokens(group)
        self._unschedule(group, plan)
        self.running.remove(group)
        self.num_running_seqs -= len(group.seqs)
        group.num_preemptions += 1
        self.num_preemptions += 1
        plan.num_preempted += 1
        if self.swap_allowed:
            if not self.manager.capabilities.swaps:
                fallbacks = self.swap_fallbacks  # a key only for managers that never swap
                fallbacks["manager_does_not_swap"] = fallbacks.get("manager_does_not_swap", 0) + 1
            elif len(group.seqs) > 1:
                self.swap_fallbacks["multi_sequence_group"] += 1
            else:
                mapping = self.manager.swap_out(group.seqs[0].seq_id)
                if mapping is not None:
                    plan.swap_out.extend(mapping)
                    group.num_swaps += 1
                    self.num_swaps += 1
                    self.swapped.append(group)
                    return
                self.swap_fallbacks["cpu_swap_space_full"] += 1
        for seq in group.seqs:
            self.manager.free(seq.seq_id)
        if len(group.seqs) == 1:
            group.seqs[0].num_computed = 0  # recompute prompt + generated tokens
        else:
            group.seqs = []  # restart the whole group from its prompt
            group.next_lineage = 0
            self._beam_rngs.pop(group.request.request_id, None)
        self.waiting.appendleft(group)

    def _swap_in(self, plan: StepPlan) -> None:
        while self.swapped:
            group = self.swapped[0]
            if self.num_running_seqs + len(group.seqs) > self.spec.max_num_seqs:
                return
            mapping = self.manager.swap_in(group.seqs[0].seq_id)
            if mapping is None:
                plan.memory_blocked = True
                return
            self.swapped.popleft()
            plan.swap_in.extend(mapping)
            self._insert_running(group)
            self.num_running_seqs += len(group.seqs)
            if not self._extend_group(group, plan):
                plan.memory_blocked = True
                return

    def _admit(self, plan: StepPlan) -> None:
        manager, waiting = self.manager, self.waiting
        max_num_seqs, chunked = self.spec.max_num_seqs, self.spec.chunked_prefill
        while waiting:
            group = waiting[0]
            width = group.width
            budget = self._budget
            if self.num_running_seqs + width > max_num_seqs or budget <= 0:
                return
            request = group.request
            restarted = bool(group.seqs)
            if restarted:  # after a preemption: its prompt and generated tokens
                seq = group.seqs[0]
                seq_id, total = seq.seq_id, seq.num_tokens
                tokens = seq.token_ids(0, total)
            else:  # NOTE: its first Sequence is made once admitted (the head is often refused)
                seq_id = self._next_seq_id
                tokens = request.prompt_token_ids
                total = len(tokens)
            # Only tokens not served by the prefix cache count against the token budget.
            cached_guess = manager.cached_prefix_tokens(tokens) if total > budget else 0
            if width == 1 and chunked:
                target = min(total, cached_guess + budget)
            elif total - cached_guess <= budget:
                target = total
            else:
                return
            admission = manager.admit(seq_id, tokens, request.kv_len, target)
            if admission is None:
                plan.memory_blocked = True
                self._memory_refused = group
                return
            if not restarted:
                seq = self._new_seq(group)  # seq_id, as admitted
            members: tuple[Sequence, ...] = ()
            if width > 1:
                members = self._fork_members(group, seq, plan)
                if members is None:
                    return
            waiting.popleft()
            group.seqs = [seq, *members]
            if self._token_sources:
                for member in group.seqs:
                    manager.set_token_source(member.seq_id, member.token_run)
            cached = admission.num_cached_tokens
            group.cached_tokens += cached
            self.prompt_tokens_queried += total
            self.prompt_tokens_cached += cached
            if group.num_preemptions:  # re-admitted (a group restarts with no sequences):
                self.readmission_tokens_cached += cached  # hits of its own freed blocks, often
            if admission.cpu_hit_tokens or admission.disk_hit_tokens:  # loaded this step
                self._count_offload_load(plan, admission, group)
            seq.num_computed = cached
            for child in members:
                child.num_computed = cached
            self._insert_running(group)
            self.num_running_seqs += width
            if target > cached:
                self._add_chunk(plan, seq, cached, target, members)
            else:  # the whole first chunk was cached: compute the next one if budget allows
                self._extend_group(group, plan)

    def _fork_members(self, group: SequenceGroup, seq: Sequence, plan: StepPlan
                      ) -> tuple[Sequence, ...] | None:
        """The other ``group.width - 1`` sequences of a multi-sequence group being admitted,
        forked from its first one ``seq``; None (and every fork freed, ``seq`` too) when
        memory runs out."""
        manager = self.manager
        members: list[Sequence] = []
        for _ in range(group.width - 1):
            child = self._new_seq(group)
            copies = manager.fork(seq.seq_id, child.seq_id, child.final_len)
            if copies is None:
                for other in [seq, *members]:
                    manager.free(other.seq_id)
                group.next_lineage = 0
                plan.memory_blocked = True
                self._memory_refused = group
                return None
            plan.copies.extend(copies)
            members.append(child)
        return tuple(members)

    def _count_offload_load(self, plan: StepPlan, admission, group: SequenceGroup) -> None:
        """The offload-tier hits of an admission: loaded into the GPU pool in this step."""
        cpu, disk = admission.cpu_hit_tokens, admission.disk_hit_tokens
        plan.offload_cpu_slots += cpu
        plan.offload_disk_slots += disk
        self.offload_tokens_cached["cpu"] += cpu
        self.offload_tokens_cached["disk"] += disk
        if group.first_token_time is None:
            loads = self.offload_loads.setdefault(group.request.request_id, [0, 0])
            loads[0] += cpu
            loads[1] += disk

    def admission_while_decoding(self, freed_memory: bool) -> bool | None:
        """Does ``schedule()`` stay closed to the waiting requests at every step from now on,
        for as long as the running sequences only decode one token each (no finish,
        preemption or swap, no arrival at an empty queue)? Used to fast-forward such steps.

        None: a step may admit. Otherwise whether those steps are memory-blocked (their
        waiting head refused for memory):

        - False when nothing waits, when static scheduling keeps admission closed, or
          when ``max_num_seqs`` or the token budget left by the decoding sequences
          refuses the waiting head (they stay as they are);
        - True when the last ``schedule()`` refused that head for memory and none was
          freed since (``freed_memory``: a request finished after it), or when the head
          does not fit the free memory now: decoding only takes memory (and evicts
          cached blocks), so it fits no better later.
        """
        if not self.waiting:
            return False
        if self.spec.scheduling != "continuous":
            return False if self.running or self.swapped else None
        group = self.waiting[0]
        width = group.width
        budget = self.spec.max_num_batched_tokens - self.num_running_seqs
        if self.num_running_seqs + width > self.spec.max_num_seqs or budget <= 0:
            return False
        if not (width == 1 and self.spec.chunked_prefill):
            seq = group.seqs[0] if group.seqs else None
            total = seq.num_tokens if seq is not None else group.request.prompt_len
            if total > budget:
                tokens = seq.token_ids(0, total) if seq is not None else group.request.prompt_token_ids
                if total - self.manager.cached_prefix_tokens(tokens) > budget:
                    return False
        if not freed_memory and self._memory_refused is group:
            return True
        return True if self._refused_for_memory(group, budget) else None

    def _refused_for_memory(self, group: SequenceGroup, budget: int) -> bool:
        """Would ``_admit`` refuse the waiting head ``group`` for memory now, with ``budget``
        tokens left? (The caller has checked ``max_num_seqs`` and the budget.)"""
        if group.width != 1:
            return False  # NOTE: its forks may need memory too: only admitting it tells
        tokens, target = self.admission_target(group, budget)
        return not self.manager.can_admit(tokens, group.request.kv_len, target)

    def admission_target(self, group: SequenceGroup, budget: int) -> tuple[np.ndarray, int]:
        """The tokens admitting the single-sequence ``group`` starts from (its prompt, or
        prompt and generated tokens after a preemption by recompute) and how many of them
        it would hold after this step with ``budget`` tokens left (as ``_admit``)."""
        seq = group.seqs[0] if group.seqs else None
        if seq is not None:  # restarted after a preemption: prompt and generated tokens
            total = seq.num_tokens
            tokens = seq.token_ids(0, total)
        else:
            tokens = group.request.prompt_token_ids
            total = len(tokens)
        target = total
        if self.spec.chunked_prefill:  # as _admit: only uncached tokens count against it
            cached = self.manager.cached_prefix_tokens(tokens) if total > budget else 0
            target = min(total, cached + budget)
        return tokens, target

    # ------------------------------------------------------------- postprocess
    def postprocess(self, plan: StepPlan, now: float,
                    sampled: dict[int, int] | None = None) -> list[SequenceGroup]:
        """Apply a finished step: advance sequences, sample, fork beams, free finished.

        ``sampled`` maps seq_id -> generated token (torch executor); None uses the
        sim's deterministic synthetic tokens. Returns the groups that finished.
        """
        if self._residency is not None:
            self._residency.now = now
        # Groups to look at after sampling, in chunk order (the order finished ones are
        # freed): single-sequence groups that just finished, and every multi-sequence
        # group that sampled (its beams may need re-selecting).
        candidates: dict[SequenceGroup, None] = {}
        decode_seqs = plan.decode_seqs
        # NOTE: chunk order (StepPlan.in_order, inlined: a generator costs more than the
        # common step's sampling of one prefill chunk); the decodes not copied when a
        # run is all of them
        lo = 0
        for hi, chunk in zip(plan.other_marks, plan.other_chunks):
            if lo < hi:
                self._sample_decodes(decode_seqs[lo:hi], now, sampled, candidates)
            self._sample_chunk(chunk, now, sampled, candidates)
            lo = hi
        if lo < len(decode_seqs):
            self._sample_decodes(decode_seqs[lo:] if lo else decode_seqs, now, sampled, candidates)
        finished = []
        for group in candidates:
            seqs = group.seqs
            if not seqs:
                continue
            output_len = group.request.output_len
            if len(seqs) > 1 and not all(seq.num_generated >= output_len for seq in seqs):
                if group.request.beam_width > 1:
                    self._reselect_beams(group)
                continue
            self._finish(group, now)
            finished.append(group)
        return finished

    @staticmethod
    def _sample_decodes(seqs: list[Sequence], now: float, sampled: dict[int, int] | None,
                        candidates: dict[SequenceGroup, None]) -> None:
        """``_sample_chunk`` of the plan's compact decodes ``seqs``.

        NOTE: its checks, specialised (the hot loop of a step): such a chunk computes the
        sequence's last token, so it always samples; the group has this one sequence; and
        its first token time is unset exactly when it has generated nothing yet (every
        sample sets it).
        """
        for seq in seqs:
            seq.num_computed += 1
            g = seq.num_generated
            if sampled is not None:
                seq.append_token(sampled[seq.seq_id])
            else:  # the formula's token (Sequence.synthetic_token_at)
                seq.num_generated = g + 1
            if not g:
                seq.group.first_token_time = now
            if g + 1 >= seq.output_len:
                candidates[seq.group] = None

    @staticmethod
    def _sample_chunk(chunk: ScheduledChunk, now: float, sampled: dict[int, int] | None,
                      candidates: dict[SequenceGroup, None]) -> None:
        """Advance the chunk's sequences; those that computed all their tokens sample the
        next one. Adds the groups ``postprocess`` then looks at to ``candidates``."""
        end = chunk.end
        for seq in (chunk.seq, *chunk.members):  # NOTE: members are of a multi-sequence group
            seq.num_computed = end
            g = seq.num_generated
            if end == seq.prompt_len + g:
                if sampled is not None:
                    seq.append_token(sampled[seq.seq_id])
                else:  # the formula's token (Sequence.synthetic_token_at)
                    seq.num_generated = g + 1
                group = seq.group
                if group.first_token_time is None:
                    group.first_token_time = now
                if len(group.seqs) != 1 or g + 1 >= seq.output_len:
                    candidates[group] = None

    def finish_decoded(self, now: float,
                       candidates: list[SequenceGroup] | None = None) -> list[SequenceGroup]:
        """Free the running groups whose every sequence has generated its output (after a
        fast-forwarded decode step), in running order, as ``postprocess`` frees them.
        ``candidates``: the running groups that may have finished, in running order
        (default: every running group)."""
        if self._residency is not None:
            self._residency.now = now
        finished = []
        for group in self.running if candidates is None else candidates:
            seqs = group.seqs
            output_len = group.request.output_len
            if len(seqs) == 1:
                if seqs[0].num_generated >= output_len:
                    finished.append(group)
            elif seqs and all(seq.num_generated >= output_len for seq in seqs):
                finished.append(group)
        for group in finished:
            self._finish(group, now)
        return finished

    def _finish(self, group: SequenceGroup, now: float) -> None:
        """Free a group whose every sequence has generated its output."""
        for seq in group.seqs:
            self.manager.free(seq.seq_id)
        self.running.remove(group)
        self.num_running_seqs -= len(group.seqs)
        group.finish_time = now
        self._beam_rngs.pop(group.request.request_id, None)

    def _reselect_beams(self, group: SequenceGroup) -> None:
        """Keep k candidates drawn (seeded) from the current beams: drop some, fork others."""
        rid = group.request.request_id
        rng = self._beam_rngs.get(rid)
        if rng is None:
            rng = self._beam_rngs[rid] = random.Random(self.seed * 1_000_003 + rid)
        beams = group.seqs
        picks = sorted(rng.choices(range(len(beams)), k=group.request.beam_width))
        keep_index = sorted(set(picks))
        survivors = [beams[i] for i in keep_index]
        for i, seq in enumerate(beams):
            if i not in keep_index:
                self.manager.free(seq.seq_id)
        children = []
        seen: set[int] = set()
        for i in picks:
            if i in seen:
                parent = beams[i]
                generated = array("q", parent.generated_ids().tolist())
                # a different candidate token than the parent's: the beams diverge here
                child = self._new_seq(group, generated)
                generated[-1] = child.synthetic_token_at(len(generated) - 1)
                copies = self.manager.fork(parent.seq_id, child.seq_id, child.final_len)
                if copies is not None:
                    child.num_computed = parent.num_computed
                    self._pending_copies.extend(copies)
                    children.append(child)
                    if self._token_sources:
                        self.manager.set_token_source(child.seq_id, child.token_run)
            seen.add(i)
        self.num_running_seqs += len(survivors) + len(children) - len(beams)
        group.seqs = survivors + children
