"""The contract every KV-cache manager fulfils, and the memory breakdown.

Managers are pure Python (no torch import). The scheduler talks to them only
through ``KVCacheManager``; the executors read block tables / slot mappings.

Sequence life cycle, as the engine drives it::

    admit(seq_id, prompt, final_len, num_tokens)   # first prefill chunk (or all)
    append(seq_id, token_ids)                      # later chunks, then 1 per decode step
    fork(parent, child, final_len)                 # parallel sampling / beams
    swap_out(seq_id) ... swap_in(seq_id)           # preemption by swapping
    free(seq_id)                                   # finish or preempt-by-recompute

Out of memory is a return value (``None``), never an exception, and leaves no
partial allocation behind. Misuse (unknown seq id, appending past
``final_len``...) raises ``ValueError``.

``final_len`` is the number of KV slots the sequence will hold when it ends
(``Request.kv_len``); the harness knows it, so "will be filled" is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, Sequence


@dataclass(frozen=True, slots=True)
class Admission:
    """Result of a successful ``admit``."""

    num_cached_tokens: int  # prompt tokens whose KV was found in the prefix cache


class MemoryBreakdown(NamedTuple):
    """Every slot of the pool, in exactly one category (docs/memory.md).

    token_states + reserved + internal_fragmentation + external_fragmentation
    + idle == capacity_slots, always.

    NOTE: a NamedTuple (immutable like a frozen dataclass, but four times cheaper to
    build): the engine builds one per step.
    """

    capacity_slots: int
    token_states: int  # holds KV of a computed token (shared slot counted once)
    reserved: int  # allocated, empty, will be filled before its sequence ends
    internal_over_reservation: int  # never filled: the policy reserved too much
    internal_rounding: int  # never filled: allocator rounding (buddy, last-block tail)
    external_fragmentation: int  # unallocated while a request waits for memory
    idle: int  # unallocated while nothing waits for memory
    logical_tokens: int  # computed tokens counted once per sequence that uses them
    allocated_slots: int  # block-level usage: slots in allocated blocks/extents
    largest_free_extent: int  # largest contiguous run of free slots a new request could use
    cached_free_slots: int = 0  # free slots still holding reusable prefix-cache KV

    @property
    def internal_fragmentation(self) -> int:
        return self.internal_over_reservation + self.internal_rounding

    @property
    def free_slots(self) -> int:
        return self.external_fragmentation + self.idle


@dataclass(slots=True)
class ManagerStats:
    """Running counters a manager keeps for the engine to report (never reset by the manager).

    NOTE: prefix-cache counters are updated only by successful ``admit`` calls, so a
    request retried after an out-of-memory ``None`` is counted once.
    """

    prefix_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int = 0  # of those, served from the cache
    cow_copies: int = 0  # copy-on-write copies returned by append (blocks or slots)
    fork_copies: int = 0  # copies returned by fork (contiguous slots; paged: always 0)
    swap_outs: int = 0  # successful swap_out calls
    swap_ins: int = 0  # successful swap_in calls
    swapped_out_units: int = 0  # blocks (paged) or slots (contiguous) moved to the CPU
    swapped_in_units: int = 0  # blocks (paged) or slots (contiguous) moved back


class KVCacheManager(Protocol):
    """What the scheduler needs from a KV memory manager."""

    name: str
    capacity_slots: int
    stats: ManagerStats

    def fits_empty_pool(self, prompt_len: int, final_len: int) -> bool:
        """Could this sequence ever be admitted, even into an empty pool?"""

    def cached_prefix_tokens(self, prompt_token_ids: Sequence[int]) -> int:
        """Prompt tokens ``admit`` would serve from the prefix cache now (0 without one)."""

    def can_admit(self, prompt_token_ids: Sequence[int], final_len: int, num_tokens: int) -> bool:
        """Would ``admit`` (with these arguments, any new id) succeed now? Changes nothing."""

    def admit(
        self, seq_id: int, prompt_token_ids: Sequence[int], final_len: int, num_tokens: int
    ) -> Admission | None:
        """Start a sequence and allocate slots for its first ``num_tokens`` prompt tokens.

        With prefix caching, the longest cached run of full prompt blocks is reused
        (at most ``len(prompt) - 1`` tokens, so at least one token is computed);
        ``num_tokens`` counts from the start of the prompt and includes cached tokens.
        Returns None (and changes nothing) when memory is short.
        """

    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[tuple[int, int]] | None:
        """Allocate slots for ``len(token_ids)`` more tokens, written this step.

        Returns the copy-on-write block copies ``[(src_block, dst_block)]`` that must
        run before the write (empty list when none), or None when memory is short.
        """

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[tuple[int, int]] | None:
        """Create ``child_id`` sharing (paged) or copying (contiguous) the parent's KV.

        Returns copies to execute ``[(src, dst)]`` (blocks for paged, slots for
        contiguous), or None when memory is short.
        """

    def free(self, seq_id: int) -> None:
        """Release a sequence's slots (tail block first for paged)."""

    def swap_out(self, seq_id: int) -> list[tuple[int, int]] | None:
        """Move a sequence's KV to the CPU pool: ``[(device_block, cpu_block)]`` or None."""

    def swap_in(self, seq_id: int) -> list[tuple[int, int]] | None:
        """Bring a swapped sequence back: ``[(cpu_block, device_block)]`` or None."""

    def slot_mapping(self, seq_id: int, start: int, end: int) -> list[int]:
        """Physical slot index of each token position in [start, end)."""

    def breakdown(self, memory_blocked: bool) -> MemoryBreakdown:
        """The memory breakdown now. O(1): maintained incrementally, never a pool scan.

        ``memory_blocked``: some request waits and was refused for lack of memory,
        so free slots count as external fragmentation rather than idle.
        """
