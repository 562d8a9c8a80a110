"""Sequences and the request-level groups the scheduler moves between queues.

``Sequence`` is the one sequence type of the harness (scheduler, executors, metrics). The
KV managers (``pagebench.allocators``) see it only by its ``seq_id`` and keep their own
private block state per id (``pagebench.allocators.paged._Seq``; its module docstring says
why that record stays separate)."""

from __future__ import annotations

from array import array
from typing import Sequence as SequenceOf

import numpy as np

from harness.workloads.request import Request
from pagebench.allocators.prefix_keys import run_bytes, token_bytes

# Synthetic generated-token ids live above every id a workload uses for prompts
# (workloads draw below 2**30), so they never collide with prompt ids.
SYNTHETIC_TOKEN_BASE = 1 << 30


class Sequence:
    """One token stream: the prompt plus what has been generated so far.

    NOTE: ``num_computed`` tokens have their KV written; the sequence needs
    ``num_tokens - num_computed`` more before it can sample the next token.

    NOTE: generated token ``i`` is ``stored[i]`` while ``i < len(stored)``, and
    ``synthetic_token_at(i)`` after: the sim's tokens are a formula of the index, so
    generating one is ``num_generated += 1`` (a span of ``count``: ``+= count``), and
    only a token that is not the formula's (a model's sample, a beam's divergent one) is
    stored, after the formula's tokens before it (``append_token``). Read the ids with
    ``token_at``, ``generated_ids`` or ``token_ids``.
    """

    __slots__ = ("seq_id", "group", "lineage", "prompt", "stored", "num_generated",
                 "num_computed", "prompt_len", "output_len", "synthetic_offset")

    def __init__(self, seq_id: int, group: "SequenceGroup", lineage: int,
                 generated: array | None = None) -> None:
        request = group.request
        self.seq_id = seq_id
        self.group = group  # None once the group finished (the engine cuts the cycle)
        self.lineage = lineage  # which sample / beam of its request this is
        self.prompt: np.ndarray = request.prompt_token_ids  # [prompt_len] int32
        # [<= num_generated] int64 ids: the generated tokens up to the last stored one
        self.stored: array = generated if generated is not None else array("q")
        self.num_generated = len(self.stored)
        self.num_computed = 0
        # NOTE: constants read on the per-step hot paths (cheaper than the attribute chains)
        self.prompt_len = len(self.prompt)
        self.output_len = request.output_len
        # generated token i is SYNTHETIC_TOKEN_BASE + (offset + i) % SYNTHETIC_TOKEN_BASE;
        # -1: the workload gives them (request.output_token_ids)
        self.synthetic_offset = -1 if lineage == 0 and request.output_token_ids is not None \
            else (request.request_id * 1_000_003 + lineage * 7_919) % SYNTHETIC_TOKEN_BASE

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_generated

    @property
    def final_len(self) -> int:
        return self.group.request.kv_len

    @property
    def finished(self) -> bool:
        return self.num_generated >= self.output_len

    def append_token(self, token: int) -> None:
        """Generate ``token``, one that need not be ``synthetic_token_at`` its index (a
        model sampled it): stored, after the formula's tokens before it."""
        stored = self.stored
        if len(stored) < self.num_generated:
            stored.extend(self.synthetic_tokens(len(stored), self.num_generated - len(stored)))
        stored.append(token)
        self.num_generated += 1

    def token_at(self, index: int) -> int:
        """Generated token ``index`` (0-based, ``< num_generated``; -1: the last)."""
        if index < 0:
            index += self.num_generated
        stored = self.stored
        return stored[index] if index < len(stored) else self.synthetic_token_at(index)

    def generated_ids(self, first: int = 0, end: int | None = None) -> np.ndarray:
        """Generated tokens ``first .. end - 1`` (default: all) as an int64 array."""
        if end is None:
            end = self.num_generated
        stored = self.stored
        if first >= len(stored):  # (the sim's: none stored)
            return self._formula_ids(first, end - first)
        split = min(len(stored), end)  # the first not stored
        return np.concatenate([np.asarray(stored[first:split], dtype=np.int64),
                               self._formula_ids(split, end - split)])

    def _formula_ids(self, first: int, count: int) -> np.ndarray:
        """``synthetic_tokens(first, count)`` as an int64 array."""
        offset = self.synthetic_offset
        if offset < 0:
            return self.group.request.output_token_ids[first:first + count].astype(np.int64)
        start = offset + first
        if start + count <= SYNTHETIC_TOKEN_BASE:  # no wrap-around
            return np.arange(SYNTHETIC_TOKEN_BASE + start, SYNTHETIC_TOKEN_BASE + start + count,
                             dtype=np.int64)
        ids = np.arange(start, start + count, dtype=np.int64)
        ids %= SYNTHETIC_TOKEN_BASE
        ids += SYNTHETIC_TOKEN_BASE
        return ids

    def token_ids(self, start: int, end: int) -> np.ndarray:
        """Token ids at positions [start, end) as an int32 array."""
        prompt_len = self.prompt_len
        if end <= prompt_len:
            return self.prompt[start:end]
        tail = self.generated_ids(max(start - prompt_len, 0), end - prompt_len).astype(np.int32)
        if start >= prompt_len:
            return tail
        return np.concatenate([self.prompt[start:], tail])

    def token_run(self, start: int, end: int) -> bytes:
        """Token ids at positions [start, end) as packed 4-byte ints (``token_ids``'
        bytes): the paged manager's token source (``set_token_source``), read when a
        block fills to hash its key."""
        index = start - self.prompt_len  # the first one's generated index
        offset = self.synthetic_offset
        if index >= len(self.stored) and offset >= 0:  # all generated by the formula
            first = SYNTHETIC_TOKEN_BASE + (offset + index) % SYNTHETIC_TOKEN_BASE
            if first + end - start <= 2 * SYNTHETIC_TOKEN_BASE:  # no wrap-around
                return run_bytes(first, end - start)  # synthetic_tokens' range
        return token_bytes(self.token_ids(start, end))

    def synthetic_token_at(self, position: int) -> int:
        """Generated token ``position``: deterministic per request, lineage and position."""
        offset = self.synthetic_offset
        if offset < 0:
            return int(self.group.request.output_token_ids[position])
        return SYNTHETIC_TOKEN_BASE + (offset + position) % SYNTHETIC_TOKEN_BASE

    def synthetic_tokens(self, first: int, count: int) -> SequenceOf[int]:
        """Generated tokens ``first .. first + count - 1``: ``synthetic_token_at`` of each
        (a ``range`` when they are consecutive ids)."""
        offset = self.synthetic_offset
        if offset < 0:
            return self.group.request.output_token_ids[first:first + count].tolist()
        start = (offset + first) % SYNTHETIC_TOKEN_BASE
        if start + count <= SYNTHETIC_TOKEN_BASE:  # no wrap-around: a plain range
            return range(SYNTHETIC_TOKEN_BASE + start, SYNTHETIC_TOKEN_BASE + start + count)
        return [self.synthetic_token_at(first + j) for j in range(count)]


class SequenceGroup:
    """A request in flight: one sequence, or several for parallel sampling / beams."""

    __slots__ = ("request", "order", "width", "seqs", "first_token_time", "finish_time",
                 "num_preemptions", "num_swaps", "cached_tokens", "next_lineage", "token_breaks")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.order = request.request_id  # priority: lower = earlier arrival = preempted last
        # sequences the group runs with once prefilled (a constant the scheduler reads often)
        self.width = max(request.num_samples, request.beam_width)
        self.seqs: list[Sequence] = []
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.num_preemptions = 0
        self.num_swaps = 0
        self.cached_tokens = 0
        self.next_lineage = 0
        # (step start time, tokens generated) at each step in which this single-sequence
        # group, having generated tokens, produced none (preempted, or waiting a step for
        # the token budget); None while there is none. Between two of them (and after the
        # last) its tokens came one per step, in consecutive steps: with the step table
        # they give every token's time (harness.metrics.latency.inter_token_latencies).
        self.token_breaks: list[tuple[float, int]] | None = None


def kv_span(last: int, tokens: SequenceOf[int]) -> SequenceOf[int]:
    """The tokens whose KV a decode span writes, given its sampled ``tokens``: the token
    sampled before it (``last``), then ``tokens`` but the last (a ``range`` when the ids
    are consecutive)."""
    if type(tokens) is range and last == tokens.start - 1:
        return range(last, tokens.stop - 1)
    return [last, *tokens[:-1]]


def decode_synthetic(seqs: list[Sequence], count: int) -> None:
    """Each sequence decodes ``count`` tokens at once (``synthetic_tokens`` of the next
    indices: ``num_generated`` grows by ``count``), and ``num_computed`` by ``count``."""
    for seq in seqs:
        seq.num_generated += count
        seq.num_computed += count
