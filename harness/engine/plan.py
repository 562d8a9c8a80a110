"""What one engine step does: the ``StepPlan`` the scheduler emits and executors run.

A plan lists the token ranges (chunks) computed this step, in scheduling order.
Most of a step's chunks are one-token decodes of single-sequence groups: those
are kept compact, as two parallel lists (``decode_seqs``, ``decode_starts``),
instead of one ``ScheduledChunk`` object each; ``chunks`` lists every chunk as
objects, in order, for whoever needs them (the torch executor, tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from harness.engine.sequence import Sequence


@dataclass(slots=True)
class ScheduledChunk:
    """Positions [start, end) of ``seq`` computed this step (shared by ``members``)."""

    seq: Sequence
    start: int
    end: int
    members: tuple[Sequence, ...] = ()

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass(slots=True)
class StepPlan:
    """Everything one engine step does, in execution order."""

    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, cpu block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu block, device block)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write / fork copies
    # NOTE: the compact one-token decodes (see the module docstring): decode_seqs[i], the
    # only sequence of its group, computes position decode_starts[i] (its last token's KV)
    # and then samples. Such a chunk is never taken back (see ``remove_chunks``).
    decode_seqs: list[Sequence] = field(default_factory=list)
    decode_starts: list[int] = field(default_factory=list)
    # every other chunk, and len(decode_seqs) when each was added: its place in chunk order
    other_chunks: list[ScheduledChunk] = field(default_factory=list)
    other_marks: list[int] = field(default_factory=list)
    num_batched_tokens: int = 0
    num_prefill_tokens: int = 0
    # NOTE: the batch's shape, kept up to date as chunks come and go (what a cost model
    # reads, without walking the chunks)
    num_seqs: int = 0  # sequences computed: each chunk's plus its members
    attention_pairs: int = 0  # (query token, context token) pairs over the chunks
    kv_read_slots: int = 0  # cached KV slots read: the context before each chunk
    num_prefill_chunks: int = 0  # chunks of more than one token
    num_preempted: int = 0
    memory_blocked: bool = False
    # physical pages mapped / unmapped this step (managers with Capabilities.maps_pages)
    num_mapped_pages: int = 0
    num_unmapped_pages: int = 0
    # KV slots loaded into the GPU pool this step from the offload tiers (prefix hits of the
    # requests admitted: engine.offload), by tier
    offload_cpu_slots: int = 0
    offload_disk_slots: int = 0

    @property
    def is_empty(self) -> bool:
        return not (self.decode_seqs or self.other_chunks)

    @property
    def chunks(self) -> list[ScheduledChunk]:
        """Every chunk, in scheduling order: a new list (the compact decodes as objects)."""
        seqs, starts = self.decode_seqs, self.decode_starts
        chunks: list[ScheduledChunk] = []
        for lo, hi, chunk in self.in_order():
            chunks.extend(ScheduledChunk(seqs[i], starts[i], starts[i] + 1) for i in range(lo, hi))
            if chunk is not None:
                chunks.append(chunk)
        return chunks

    def in_order(self) -> Iterator[tuple[int, int, ScheduledChunk | None]]:
        """Chunk order as ``(lo, hi, chunk)``: the compact decodes ``lo .. hi - 1``, then
        ``chunk`` (None after the last decodes)."""
        lo = 0
        for hi, chunk in zip(self.other_marks, self.other_chunks):
            yield lo, hi, chunk
            lo = hi
        yield lo, len(self.decode_seqs), None

    def add_decodes(self, seqs: list[Sequence], starts: list[int], prompt_ends: int = 0) -> None:
        """Add one-token decodes: ``seqs[i]`` (the only sequence of its group, with all
        its tokens but the last computed) computes position ``starts[i]``. ``prompt_ends``
        of them have generated nothing yet: their token is the prompt's last (prefill)."""
        if self.decode_seqs:
            self.decode_seqs.extend(seqs)
            self.decode_starts.extend(starts)
        else:  # NOTE: the common case (one run per step): the caller's lists are the plan's
            self.decode_seqs, self.decode_starts = seqs, starts
        count = len(seqs)
        kv_read = sum(starts)
        self.num_batched_tokens += count
        self.num_prefill_tokens += prompt_ends
        self.num_seqs += count
        self.kv_read_slots += kv_read
        self.attention_pairs += kv_read + count  # a decode token attends to start + 1

    def add_chunk(self, chunk: ScheduledChunk) -> None:
        self.other_chunks.append(chunk)
        self.other_marks.append(len(self.decode_seqs))
        self._count(chunk, 1)

    def remove_chunks(self, seq_ids: set[int]) -> int:
        """Take back the ``other_chunks`` of these sequences; returns their tokens.

        NOTE: only a preempted group's chunks are taken back, and the scheduler schedules
        compact decodes for groups that come before any it may preempt in this step.
        """
        kept: list[ScheduledChunk] = []
        marks: list[int] = []
        tokens = 0
        for chunk, mark in zip(self.other_chunks, self.other_marks):
            if chunk.seq.seq_id in seq_ids:
                tokens += chunk.end - chunk.start
                self._count(chunk, -1)
            else:
                kept.append(chunk)
                marks.append(mark)
        self.other_chunks[:] = kept
        self.other_marks[:] = marks
        return tokens

    def _count(self, chunk: ScheduledChunk, sign: int) -> None:
        """Add (``sign`` 1) or take back (-1) ``chunk``'s share of the plan's totals."""
        n, start = chunk.end - chunk.start, chunk.start
        self.num_batched_tokens += sign * n
        # prefill: prompt tokens (the last one alone too), or several tokens of a recompute
        if chunk.end < chunk.seq.num_tokens or n > 1 or chunk.members or not chunk.seq.num_generated:
            self.num_prefill_tokens += sign * n
        self.num_seqs += sign * (1 + len(chunk.members))
        # token i (0-based in the chunk) attends to start + i + 1 positions
        self.attention_pairs += sign * (n * start + n * (n + 1) // 2)
        self.kv_read_slots += sign * start
        self.num_prefill_chunks += sign * (n > 1)
