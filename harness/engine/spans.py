"""What a fast-forward span works with, for every manager's span path (``fast_forward``,
``fast_forward_hybrid``): the requests yet to arrive, the span limits, the decoding batch a
span starts from, and what one call did."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate

from typing import TYPE_CHECKING

from harness.engine.sequence import SYNTHETIC_TOKEN_BASE, Sequence, SequenceGroup, kv_span

if TYPE_CHECKING:
    from harness.engine.scheduler import Scheduler

MAX_SPAN = 4096
PRICE_WINDOW = 64  # steps priced before looking further for the next arrival


@dataclass
class Arrivals:
    """The requests yet to arrive, as fast-forward needs them.

    NOTE: plain lists: spans are short, and a few Python steps over them cost less
    than numpy's per-call overhead.
    """

    times: list[float]  # [num_requests] arrival times, ascending
    joins: list[int]  # [num_requests + 1]: requests among the first i that are not rejected
    next: int = 0  # the first request that has not arrived

    @classmethod
    def of(cls, requests, reasons: list[str | None]) -> "Arrivals":
        """From the run's requests and each one's rejection reason (None: it joins the queue)."""
        times = [float(r.arrival_time) for r in requests]
        joins = list(accumulate((reason is None for reason in reasons), initial=0))
        return cls(times, joins)

    @property
    def next_time(self) -> float | None:
        return self.times[self.next] if self.next < len(self.times) else None

    def joined_by(self, starts: list[float], waiting: int = 0) -> list[int]:
        """[len(starts)]: requests that join the waiting queue before a step starting at each
        time (``starts`` ascending; the engine takes arrivals at or before a step's start),
        plus ``waiting`` (those queued already: the steps' ``num_waiting``).

        NOTE: a span's steps outnumber its arrivals many times over, so the counts are
        filled run by run, between the steps that see a new arrival (found by bisection).
        """
        times, joins, first = self.times, self.joins, self.next
        end, span = len(times), len(starts)
        base = joins[first] - waiting
        counts: list[int] = []
        step = 0  # the first step without a count
        arrived = bisect_right(times, starts[0], first)  # requests arrived by that step's start
        while arrived < end:
            # steps before the first that starts at or after the next arrival see no new one
            upto = bisect_left(starts, times[arrived], step)
            if upto == span:
                break
            counts += [joins[arrived] - base] * (upto - step)
            step = upto
            arrived = bisect_right(times, starts[step], arrived)
        counts += [joins[arrived] - base] * (span - step)
        return counts


@dataclass
class Advance:
    """What one ``fast_forward`` call did."""

    now: float  # the clock after the last step of the span
    finished: list[SequenceGroup]  # groups that finished in the last step, in running order
    may_continue: bool  # the span ended only because requests finished: try another


@dataclass
class DecodingBatch:
    """The running sequences when every one of them decodes (the start of a span), in
    running order; each list is ``[num_seqs]``."""

    seqs: list[Sequence]
    computed: list[int]  # its KV slots written (its generated tokens: computed - prompt_len + 1)
    remaining: list[int]  # tokens left to generate
    workload_tokens: list[int]  # the indices of those generating tokens the workload gives

    @classmethod
    def of(cls, scheduler: "Scheduler") -> "DecodingBatch | None":
        """The batch, or None when a group searches beams (re-selected every step) or a
        sequence still prefills (or has not sampled its first token)."""
        # NOTE: the sequences of width-1 groups (no beam search: their requests are not
        # read) are gathered by a comprehension first, so the loop runs once per sequence
        # without a loop over each group's list (Azure conv paged: about 18% of this walk);
        # ``xs.append(x)`` is cheaper than a bound ``append`` kept in a local on Python
        # 3.11 (a specialised call)
        running = scheduler.running
        seqs = [group.seqs[0] for group in running if group.width == 1]
        if len(seqs) < len(running):  # parallel samples, or beams
            if any(group.request.beam_width > 1 for group in running):
                return None
            seqs = [seq for group in running for seq in group.seqs]
        computed: list[int] = []
        remaining: list[int] = []
        workload_tokens: list[int] = []
        for seq in seqs:
            g = seq.num_generated
            c = seq.num_computed
            if c != seq.prompt_len + g - 1 or not g:
                return None
            if seq.synthetic_offset < 0:
                workload_tokens.append(len(computed))
            computed.append(c)
            remaining.append(seq.output_len - g)
        return cls(seqs, computed, remaining, workload_tokens)

    def kv_tokens(self, span: int) -> list[range | list[int]]:
        """[num_seqs]: each sequence's tokens whose KV the next ``span`` steps write
        (``kv_span``); read before the span's tokens are added.

        NOTE: most are synthetic ids that do not wrap around: the range from the last
        one, inlined (the loop runs once per running sequence and span)."""
        base = SYNTHETIC_TOKEN_BASE
        spans: list[range | list[int]] = []
        for seq in self.seqs:
            first = seq.num_generated
            offset = seq.synthetic_offset
            start = (offset + first) % base  # token ``first`` is base + start (synthetic)
            if offset >= 0 and not seq.stored and 0 < start <= base - span:
                spans.append(range(base + start - 1, base + start + span - 1))
            else:
                spans.append(kv_span(seq.token_at(first - 1), seq.synthetic_tokens(first, span)))
        return spans
