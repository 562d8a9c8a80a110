"""Sequences and the request-level groups the scheduler moves between queues.

``Sequence`` is the one sequence type of the harness (scheduler, executors, metrics). The
KV managers (``pagebench.allocators``) see it only by its ``seq_id`` and keep their own
private block state per id (``pagebench.allocators.paged._Seq``; its module docstring says
why that record stays separate)."""

from __future__ import annotations

import sys
from array import array
from typing import Sequence as SequenceOf

import numpy as np

from harness.workloads.request import Request

# Synthetic generated-token ids live above every id a workload uses for prompts
# (workloads draw below 2**30), so they never collide with prompt ids.
SYNTHETIC_TOKEN_BASE = 1 << 30
# decode_synthetic's int64 words 1, 1, 1, ... and 0, 1, 2, ..., as native bytes
_RAMP_WORDS = 4096
_ONES = (array("q", [1]) * _RAMP_WORDS).tobytes()
_STEPS = array("q", range(_RAMP_WORDS)).tobytes()


class Sequence:
    """One token stream: the prompt plus what has been generated so far.

    NOTE: ``num_computed`` tokens have their KV written; the sequence needs
    ``num_tokens - num_computed`` more before it can sample the next token.
    """

    __slots__ = ("seq_id", "group", "lineage", "prompt", "generated", "num_computed",
                 "prompt_len", "output_len", "synthetic_offset")

    def __init__(self, seq_id: int, group: "SequenceGroup", lineage: int,
                 generated: array | None = None) -> None:
        request = group.request
        self.seq_id = seq_id
        self.group = group  # None once the group finished (the engine cuts the cycle)
        self.lineage = lineage  # which sample / beam of its request this is
        self.prompt: np.ndarray = request.prompt_token_ids  # [prompt_len] int32
        # int64 ids: cheap to extend by a range and to hash (its bytes are the digest's)
        self.generated: array = generated if generated is not None else array("q")
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
        return self.prompt_len + len(self.generated)

    @property
    def final_len(self) -> int:
        return self.group.request.kv_len

    @property
    def finished(self) -> bool:
        return len(self.generated) >= self.output_len

    def token_ids(self, start: int, end: int) -> np.ndarray:
        """Token ids at positions [start, end) as an int32 array."""
        prompt_len = self.prompt_len
        if end <= prompt_len:
            return self.prompt[start:end]
        tail = np.asarray(self.generated[max(start - prompt_len, 0):end - prompt_len], dtype=np.int32)
        if start >= prompt_len:
            return tail
        return np.concatenate([self.prompt[start:], tail])

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


def decode_synthetic(seqs: list[Sequence], firsts: list[int], count: int,
                     kv_tokens: list | None = None) -> None:
    """Each sequence decodes ``count`` tokens at once: ``generated`` grows by
    ``synthetic_tokens(first, count)`` (``first`` = ``len(generated)``, from ``firsts``)
    and ``num_computed`` by ``count``. ``kv_tokens``, when a list, gets each one's
    ``kv_span`` (read before the tokens are added).

    NOTE: ``array.extend`` converts a range element by element. A run of consecutive ids
    ``start, start + 1, ...`` is copied in as bytes instead: as native int64 words they are
    the bytes of the integer ``start * ones + steps``, where ``ones``' words are all 1 and
    ``steps``' are 0, 1, 2, ... (no word carries into the next: every id is below 2**31),
    and Python computes that in a few C loops over the words.
    """
    base, order = SYNTHETIC_TOKEN_BASE, sys.byteorder
    limit = -1  # the last start that neither wraps nor runs past the ramp (none: -1)
    if count <= _RAMP_WORDS:
        limit = base - count
        width = 8 * count  # the bytes of ``count`` int64 words ("q")
        ones = int.from_bytes(_ONES[:width], order)
        ramp = base * ones + int.from_bytes(_STEPS[:width], order)  # base + 0, base + 1, ...
    keep = kv_tokens.append if kv_tokens is not None else None
    for seq, first in zip(seqs, firsts):
        generated = seq.generated
        offset = seq.synthetic_offset
        start = (offset + first) % base
        if offset < 0 or start > limit:  # given, or wrapping
            tokens = seq.synthetic_tokens(first, count)
            if keep is not None:
                keep(kv_span(generated[-1], tokens))
            generated.extend(tokens)
        else:
            if keep is not None:  # kv_span, inlined: the last token is start - 1 (no wrap)
                last = generated[-1]
                keep(range(last, last + count) if last == base + start - 1
                     else [last, *range(base + start, base + start + count - 1)])
            generated.frombytes((start * ones + ramp).to_bytes(width, order))
        seq.num_computed += count
