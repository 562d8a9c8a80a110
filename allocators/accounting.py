"""The memory breakdown of docs/memory.md, kept up to date operation by operation.

Both managers keep a few running sums and turn them into a ``MemoryBreakdown`` in
O(1); nothing here ever scans the pool.

Paged (``PartialBlockLedger``). Blocks are allocated on demand, so every block of a
sequence except its last is full. A full block is all token_states. A partially
filled block holds ``fill`` written slots (token_states); of its empty slots those
at positions below the owner's ``final_len`` are reserved and the rest (the tail of
the last block past ``final_len``) is allocator rounding. A partially filled block
is shared only after a fork (prefix hits share full blocks only), and then every
owner has written the same ``fill`` tokens into it. NOTE: its fill target is the
maximum over its owners: the last owner to write keeps the block (the others copy
on write), and it fills the block up to its own target.

Hybrid (``paged_hybrid``): one ``PartialBlockLedger`` per layer kind, in tokens of that
kind's blocks, scaled by the units one token takes in all its KV cache groups; the part
of each page its group cannot fill is ``internal_page_padding``.

Contiguous (``ExtentLedger``). Per sequence: written slots are token_states,
``final_len - written`` reserved, ``reservation - final_len`` policy
over-reservation, ``arena_taken - reservation`` allocator rounding (buddy).
"""

from __future__ import annotations

from pagebench.allocators.base import MemoryBreakdown


def make_breakdown(
    *,
    capacity_slots: int,
    allocated_slots: int,
    token_states: int,
    reserved: int,
    internal_over_reservation: int,
    internal_rounding: int,
    memory_blocked: bool,
    logical_tokens: int,
    largest_free_extent: int,
    cached_free_slots: int = 0,
    internal_page_padding: int = 0,
    group_blocks: tuple[int, ...] = (),
) -> MemoryBreakdown:
    """Assemble a breakdown; free slots are external fragmentation iff ``memory_blocked``."""
    free = capacity_slots - allocated_slots
    return MemoryBreakdown(
        capacity_slots=capacity_slots,
        token_states=token_states,
        reserved=reserved,
        internal_over_reservation=internal_over_reservation,
        internal_rounding=internal_rounding,
        external_fragmentation=free if memory_blocked else 0,
        idle=0 if memory_blocked else free,
        logical_tokens=logical_tokens,
        allocated_slots=allocated_slots,
        largest_free_extent=largest_free_extent,
        cached_free_slots=cached_free_slots,
        internal_page_padding=internal_page_padding,
        group_blocks=group_blocks,
    )


class PartialBlockLedger:
    """Partially filled paged blocks and their owners' fill targets.

    ``fill_sum`` = sum of fills, ``target_sum`` = sum of per-block max targets,
    ``count`` = number of partial blocks. Every other allocated block is full.
    Callers pass a block's fill (all owners agree on it); the ledger keeps only
    each partial block's owner targets: ``sole`` (block -> its one owner's target) and
    ``shared`` (block -> each owner's target, two or more, after a fork).

    NOTE: sole owners (nearly every partial block) are kept apart, as plain ints, so that
    the paged manager's decode growth (``_grow_together``) replaces them in place, one
    dict operation each, and changes the sums once.
    """

    __slots__ = ("block_size", "sole", "shared", "fill_sum", "target_sum", "count")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.sole: dict[int, int] = {}  # partial block with one owner -> its fill target
        self.shared: dict[int, list[int]] = {}  # partial block -> each owner's fill target
        self.fill_sum = 0
        self.target_sum = 0
        self.count = 0

    @property
    def num_shared(self) -> int:
        """Partial blocks with more than one owner (after a fork)."""
        return len(self.shared)

    def add_owner(self, block: int, fill: int, target: int) -> None:
        """An owner whose last block ``block`` holds ``fill`` tokens, to be filled to ``target``."""
        owners = self.shared.get(block)
        if owners is None:
            first = self.sole.pop(block, None)
            if first is None:  # a new partial block
                self.sole[block] = target
                self.fill_sum += fill
                self.target_sum += target
                self.count += 1
                return
            owners = self.shared[block] = [first]
        old = max(owners)
        owners.append(target)
        if target > old:
            self.target_sum += target - old

    def remove_owner(self, block: int, fill: int, target: int) -> None:
        """The owner with fill target ``target`` no longer uses partial block ``block``."""
        owners = self.shared.get(block)
        if owners is None:
            del self.sole[block]
            self.fill_sum -= fill
            self.target_sum -= target
            self.count -= 1
            return
        old = max(owners)
        owners.remove(target)
        if len(owners) == 1:
            del self.shared[block]
            self.sole[block] = owners[0]
        self.target_sum += max(owners) - old

    def slots(self, allocated_slots: int) -> tuple[int, int, int]:
        """(token_states, reserved, rounding) for a pool with ``allocated_slots`` in use."""
        partial_slots = self.count * self.block_size
        return (allocated_slots - partial_slots + self.fill_sum,
                self.target_sum - self.fill_sum,
                partial_slots - self.target_sum)


class ExtentLedger:
    """Running sums over contiguous reservations (device-resident sequences only)."""

    __slots__ = ("written", "final", "reservation", "taken")

    def __init__(self) -> None:
        self.written = 0  # sum of written slots          -> token_states (and logical tokens)
        self.final = 0  # sum of final_len               -> reserved = final - written
        self.reservation = 0  # sum of policy reservations -> over-reservation = reservation - final
        self.taken = 0  # sum of arena-taken sizes       -> rounding = taken - reservation

    def add(self, written: int, final: int, reservation: int, taken: int) -> None:
        self.written += written
        self.final += final
        self.reservation += reservation
        self.taken += taken

    def remove(self, written: int, final: int, reservation: int, taken: int) -> None:
        self.written -= written
        self.final -= final
        self.reservation -= reservation
        self.taken -= taken


class KindLedger:
    """One layer kind of a hybrid manager (``paged_hybrid``): the blocks its KV cache
    groups hold (counted per group: they move in lockstep), their partial last blocks,
    and what a block counts for, in units.

    ``tokens_per_block`` None: a linear kind, whose block is a state page (all token
    states but for its padding)."""

    __slots__ = ("tokens_per_block", "token_units", "padding_units", "partial", "blocks", "peak")

    def __init__(self, tokens_per_block: int | None, token_units: int, padding_units: int) -> None:
        self.tokens_per_block = tokens_per_block
        self.token_units = token_units  # units of one token (attention) or the state (linear)
        self.padding_units = padding_units  # units of a block (all groups) nothing fills
        self.partial = PartialBlockLedger(tokens_per_block or 1)
        self.blocks = 0  # blocks in use (ref > 0) of each group of the kind
        self.peak = 0

    def take(self, blocks: int) -> None:
        self.blocks += blocks
        self.peak = max(self.peak, self.blocks)

    def add_tail(self, block: int, num_tokens: int, final_len: int) -> None:
        """A sequence of ``num_tokens`` whose last block is ``block`` (if partly filled)."""
        t = self.tokens_per_block
        if t is not None and num_tokens % t:
            self.partial.add_owner(block, num_tokens % t, min(t, final_len - num_tokens // t * t))

    def remove_tail(self, block: int, num_tokens: int, final_len: int) -> None:
        t = self.tokens_per_block
        if t is not None and num_tokens % t:
            self.partial.remove_owner(block, num_tokens % t, min(t, final_len - num_tokens // t * t))

    def slots(self) -> tuple[int, int, int, int]:
        """(token_states, reserved, rounding, page padding) in units."""
        units, padding = self.token_units, self.blocks * self.padding_units
        if self.tokens_per_block is None:
            return self.blocks * units, 0, 0, padding
        tokens, empty, beyond = self.partial.slots(self.blocks * self.tokens_per_block)
        return tokens * units, empty * units, beyond * units, padding
