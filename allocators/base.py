"""The contract every KV-cache manager fulfils, and the memory breakdown.

Managers are pure Python (no torch import). The scheduler, fast-forward, the engine
and the executors talk to them only through ``KVCacheManager``; what a manager can do
beyond it is declared in its ``capabilities`` (``Capabilities``), never probed with
``getattr``/``isinstance``. A manager registers itself with ``@register_manager(kind)``
(one file in ``allocators/``) and the system catalog (``conf/allocator/``) names the kind.

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
(``Request.kv_len``). The harness knows it, so the breakdown's "will be filled"
(reserved vs internal fragmentation) is exact: every manager receives it as an
ACCOUNTING input. Only a policy declaring ``Capabilities.knows_final_len`` (oracle,
pow2) may let it decide an allocation; for every other manager the allocation
(admission, blocks or pages, copies) is independent of it, which
``tests/test_alloc_registry.py`` checks by running each one with two different final
lengths (docs/managers.md, "Oracle knowledge").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, NamedTuple, Protocol, Sequence


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a manager offers beyond ``KVCacheManager``, declared (never probed).

    layout: how the executors address its KV: ``paged`` (``block_table`` of
    ``block_size``-slot blocks, ``num_blocks``/``num_cpu_blocks``) or ``contiguous``
    (``slot_range`` in a linear space of ``capacity_slots``/``num_cpu_slots``) or
    ``none`` (no torch layout: the sim executor only). The class declares the same as
    ``tensor_layout``, so a config is checked before any manager is built.
    batched_decode: ``append_decode(seq_ids, tokens, copies) -> done`` (``BatchedDecode``).
    bulk_decode: fast-forward's closed form for a span of decode steps: ``paged``
    (``PagedBulkDecode``), ``contiguous`` (``append_batch``, a constant allocation, and
    ``advance_all(count, num_seqs)``: every sequence held appends ``count`` tokens in O(1)),
    ``hybrid`` (``HybridBulkDecode``: the span's steps appended one by one, without the
    scheduler), or None (fast-forward steps this manager one step at a time).
    prefix_cache: ``admit`` may serve prompt tokens from a cache (``cached_prefix_tokens``).
    knows_final_len: the allocation policy reads ``final_len`` (oracle knowledge).
    maps_pages: it counts physical page mappings (``stats.mapped_pages`` /
    ``unmapped_pages``), which the scheduler puts into each step plan for the time model.
    slot_copies: its copies (fork, copy-on-write) are slot pairs even under the paged
    layout, and a forked member holds its own slots for the tokens of the chunk it joins.
    layer_groups: it keeps KV per layer group (``LayerGroupReport``): its slot is
    ``slot_bytes`` bytes (not the model's ``bytes_per_slot``), its breakdown's
    ``group_blocks`` counts the blocks each layer kind holds, and
    ``layer_group_report()`` gives its layout and per-kind counters for results.json.
    block_residency: its blocks live in a ``BlockPool`` (``pool``), whose transitions
    ``attach_residency(log)`` records (``pagebench.allocators.residency``).
    swaps: ``swap_out`` / ``swap_in`` move a sequence to CPU memory and back; without
    it (radix, paged_hybrid) a preemption under ``engine.preemption=swap`` recomputes,
    counted as ``manager_does_not_swap`` in results.json's ``recomputed_instead_of_swap``.
    reads_decode_tokens: ``append_decode`` reads its ``token_ids`` (default, the safe
    side). False: it never looks at them (it keys nothing on token content, or reads the
    ids from ``token_sources``), and the scheduler passes ``None`` instead of building one
    id per decoding sequence per step.
    token_sources: it keys blocks on token ids read from each sequence's token source,
    ``set_token_source(seq_id, source)``, which the engine gives every sequence it admits
    or forks (``Sequence.token_run``); the ids its appends are given are only counted.
    """

    layout: Literal["paged", "contiguous", "none"]
    batched_decode: bool = False
    bulk_decode: Literal["paged", "contiguous", "hybrid"] | None = None
    prefix_cache: bool = False
    knows_final_len: bool = False
    maps_pages: bool = False
    slot_copies: bool = False
    layer_groups: bool = False
    swaps: bool = True
    block_residency: bool = False
    reads_decode_tokens: bool = True
    token_sources: bool = False


@dataclass(frozen=True, slots=True)
class Admission:
    """Result of a successful ``admit``."""

    num_cached_tokens: int  # prompt tokens whose KV was found in the prefix cache
    # of those, tokens loaded from the offload tiers (pagebench.allocators.offload_tier) into new blocks
    cpu_hit_tokens: int = 0
    disk_hit_tokens: int = 0


class MemoryBreakdown(NamedTuple):
    """Every slot of the pool, in exactly one category (docs/memory.md).

    token_states + reserved + internal_fragmentation + external_fragmentation
    + idle == capacity_slots, always (internal_fragmentation: over-reservation, rounding
    and page padding).

    NOTE: a NamedTuple (immutable like a frozen dataclass, but four times cheaper to
    build): the engine builds one per step.
    """

    capacity_slots: int
    token_states: int  # holds KV of a computed token (shared slot counted once)
    reserved: int  # allocated, empty, will be filled before its sequence ends
    internal_over_reservation: int  # never filled: the policy reserved too much
    internal_rounding: int  # never filled: allocator rounding (buddy, last-block tail)
    # NOTE: internal_page_padding (page unification, a hybrid manager's) is a field at the end
    external_fragmentation: int  # unallocated while a request waits for memory
    idle: int  # unallocated while nothing waits for memory
    logical_tokens: int  # computed tokens counted once per sequence that uses them
    allocated_slots: int  # block-level usage: slots in allocated blocks/extents
    largest_free_extent: int  # largest contiguous run of free slots a new request could use
    cached_free_slots: int = 0  # free slots still holding reusable prefix-cache KV
    # never filled: the part of a unified page its group does not use (padding layers, a
    # state smaller than the page, the tokens-per-block floor); 0 for one uniform page
    internal_page_padding: int = 0
    group_blocks: tuple[int, ...] = ()  # blocks each layer kind holds (a hybrid manager's)

    @property
    def internal_fragmentation(self) -> int:
        return self.internal_over_reservation + self.internal_rounding + self.internal_page_padding

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
    mapped_pages: int = 0  # physical pages mapped into virtual ranges (vattention)
    unmapped_pages: int = 0  # pages unmapped when they returned to the free pool (vattention)
    evicted_slots: int = 0  # cached slots evicted to make room (radix)
    peak_virtual_slots: int = 0  # most virtual address space reserved at once, in slots


class KVCacheManager(Protocol):
    """What the scheduler, fast-forward, the engine and the executors need from a KV
    memory manager (and all they may call, besides what ``capabilities`` declares)."""

    name: str
    capacity_slots: int
    stats: ManagerStats
    capabilities: Capabilities

    def fits_empty_pool(self, prompt_len: int, final_len: int) -> bool:
        """Could this sequence ever be admitted, even into an empty pool?"""

    def member_slots(self, prompt_len: int, final_len: int) -> int:
        """Slots one sequence of a group of this length takes from an empty pool (the
        engine rejects a group whose members cannot all fit at once)."""

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


class BatchedDecode(Protocol):
    """``Capabilities.batched_decode``: one decode token for many sequences in one call."""

    def append_decode(self, seq_ids: Sequence[int], token_ids: Any,
                      copies: list[tuple[int, int]]) -> int:
        """``append(seq_id, [token])`` for each in order, copies into ``copies``; stops at
        the first that does not fit and returns how many got their slot. ``token_ids`` is
        None when ``Capabilities.reads_decode_tokens`` is False (the ids go unread)."""

    def append_batch(self, seq_ids: Sequence[int], token_lists: Sequence[Sequence[int]],
                     copies: list[tuple[int, int]]) -> int:
        """``append(seq_id, tokens)`` for each pair in order (the same contract)."""


class PagedBulkDecode(BatchedDecode, Protocol):
    """``Capabilities.bulk_decode == "paged"``: what fast-forward reads to write a span of
    decode steps in closed form over fixed-size blocks."""

    block_size: int
    num_free_blocks: int
    has_shared_partial_blocks: bool

    def can_append_without_copy(self, seq_id: int) -> bool: ...

    def cached_flags_at_head(self, n: int) -> list[bool]:
        """Whether each of the next ``n`` blocks to be allocated still holds cached KV."""

    def prefix_frontier_key(self, prompt_token_ids: Sequence[int]) -> int | None: ...

    def filled_block_keys(self, seq_id: int, token_ids: Sequence[int]) -> list[int]: ...


class HybridBulkDecode(Protocol):
    """``Capabilities.bulk_decode == "hybrid"``: what fast-forward reads to run a span of
    decode steps (``append`` of one token per sequence, step by step) without the
    scheduler, and to know where the scheduler would decide otherwise (a sliding window
    returns blocks mid-span, so a refused waiting head may fit again)."""

    def can_append_without_copy(self, seq_id: int) -> bool: ...

    def decode_span_events(self, seq_ids: Sequence[int], span: int) -> tuple[list[int], list[int]]:
        """``[span]`` each: blocks each step allocates, and table entries it drops (an upper
        bound on the blocks it returns to the free queue)."""

    def admission_need(self, prompt_token_ids: Sequence[int], num_tokens: int) -> tuple[int, set[int]]:
        """(free blocks ``admit`` would take now, the blocks of its prefix hit)."""

    def next_blocks(self, n: int) -> list[int]:
        """The next ``n`` blocks an allocation takes, head first."""


class LayerGroupReport(Protocol):
    """``Capabilities.layer_groups``: a manager that keeps KV per layer group."""

    slot_bytes: int  # bytes of one unit of its breakdown (its capacity_slots count them)

    def layer_group_report(self) -> dict:
        """Its page layout and per-kind counters (group ``i`` of ``group_blocks`` is
        ``kinds[i]``), JSON-ready."""


def append_in_order(append: Callable, seq_ids: Sequence[int], token_lists: Sequence[Sequence[int]],
                    copies: list[tuple[int, int]]) -> int:
    """``BatchedDecode.append_batch`` from a manager's ``append``: each in order, copies into
    ``copies``; stops at the first that does not fit, returns how many got their tokens."""
    for done, (seq_id, tokens) in enumerate(zip(seq_ids, token_lists)):
        grown = append(seq_id, tokens)
        if grown is None:
            return done
        copies.extend(grown)
    return min(len(seq_ids), len(token_lists))


MANAGERS: dict[str, type] = {}  # kind -> manager class (filled by @register_manager)


def register_manager(kind: str) -> Callable[[type], type]:
    """Class decorator: make a manager the system catalog's ``kind: <kind>``.

    The class provides ``from_system(system, capacity_slots, cpu_slots, max_model_len,
    model)`` (build it for a catalog entry), ``system_problem(system)`` (None, or
    ``(key, problem)`` for a bad catalog entry), ``label(system)`` (a short name) and
    ``tensor_layout`` (its ``Capabilities.layout``, read before any manager is built).
    """
    def register(cls: type) -> type:
        if getattr(cls, "tensor_layout", None) not in ("paged", "contiguous", "none"):
            raise ValueError(f"manager {cls.__name__} must declare tensor_layout = 'paged', "
                             "'contiguous' or 'none' (see Capabilities.layout)")
        if kind in MANAGERS and MANAGERS[kind] is not cls:
            raise ValueError(f"manager kind {kind!r} is registered twice "
                             f"({MANAGERS[kind].__name__} and {cls.__name__})")
        cls.kind = kind
        MANAGERS[kind] = cls
        return cls
    return register
