"""Placement of extents in one linear slot space ``[0, capacity)``.

Three arenas share one interface (``allocate`` / ``free`` / ``taken_size`` /
``largest_free_extent`` / ``max_allocation``):

- ``buddy``: sizes rounded up to a power of two; a block splits into two buddies
  and a freed block merges with its free buddy, repeatedly. A capacity that is not
  a power of two is covered by its maximal power-of-two roots laid out from
  address 0 in decreasing size (1000 = 512 + 256 + 128 + 64 + 32 + 8); buddies
  never merge across roots. Allocation takes the lowest-address free block of the
  smallest order that fits.
- ``first_fit``: exact sizes; the lowest-address free interval that fits.
- ``best_fit``: exact sizes; the smallest free interval that fits (lowest address
  on ties).

Both fits cut the extent from the low end of the chosen interval and coalesce a
freed extent with its free neighbours. ``largest_free_extent`` is what one new
allocation could get: the largest free buddy block (O(log capacity)), or the
largest free interval (O(1)).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from bisect import bisect_left, insort


def _check_capacity(capacity: int) -> None:
    if not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"arena capacity must be a positive int (slots), got {capacity!r}: "
                         "give the pool at least one slot")


def _check_size(size: int) -> None:
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"allocation size must be a positive int (slots), got {size!r}")


class BuddyArena:
    """Binary buddy allocator over ``capacity`` slots."""

    kind = "buddy"
    __slots__ = ("capacity", "free_slots", "_free", "_heaps", "_alloc", "_max_root", "_orders")

    def __init__(self, capacity: int) -> None:
        _check_capacity(capacity)
        self.capacity = capacity
        self.free_slots = capacity
        top = capacity.bit_length()
        self._free: list[set[int]] = [set() for _ in range(top)]  # order -> free block starts
        self._heaps: list[list[int]] = [[] for _ in range(top)]  # lazy min-heaps over _free
        self._alloc: dict[int, int] = {}  # start -> order
        # NOTE: bit j set iff _free[j] is not empty: the smallest order that fits and the
        # largest free block are found in O(1) (a scan of the orders cost a loop per
        # allocation, refusal and memory breakdown)
        self._orders = 0
        addr = 0
        for order in range(top - 1, -1, -1):
            if capacity >> order & 1:
                self._push(order, addr)
                addr += 1 << order
        self._max_root = 1 << (top - 1)

    def _push(self, order: int, addr: int) -> None:
        self._free[order].add(addr)
        self._orders |= 1 << order
        h = self._heaps[order]
        heapq.heappush(h, addr)
        if len(h) > 2 * len(self._free[order]) + 32:  # drop stale entries
            self._heaps[order] = sorted(self._free[order])

    def _pop_lowest(self, order: int) -> int:
        s, h = self._free[order], self._heaps[order]
        while True:
            addr = heapq.heappop(h)
            if addr in s:
                s.remove(addr)
                if not s:
                    self._orders &= ~(1 << order)
                return addr

    @staticmethod
    def taken_size(size: int) -> int:
        """Slots an allocation of ``size`` takes: the next power of two."""
        if type(size) is not int or size <= 0:  # (the common case without a call)
            _check_size(size)
        return 1 << (size - 1).bit_length()

    def max_allocation(self) -> int:
        """The largest size an empty arena could place (its largest root)."""
        return self._max_root

    def allocate(self, size: int) -> int | None:
        """Start of a new block of ``taken_size(size)`` slots, or None when none is free."""
        if type(size) is not int or size <= 0:  # (the common case without a call)
            _check_size(size)
        k = (size - 1).bit_length()
        fitting = self._orders >> k  # bit i: a free block of order k + i
        if not fitting:
            return None
        j = k + (fitting & -fitting).bit_length() - 1  # the smallest such order
        addr = self._pop_lowest(j)
        while j > k:
            j -= 1
            self._push(j, addr + (1 << j))
        self._alloc[addr] = k
        self.free_slots -= 1 << k
        return addr

    def free(self, start: int) -> None:
        k = self._alloc.pop(start, None)
        if k is None:
            raise ValueError(f"no buddy block starts at slot {start}; free only starts returned "
                             "by allocate, once each")
        self.free_slots += 1 << k
        free, addr = self._free, start
        while k + 1 < len(free):
            buddy = addr ^ (1 << k)
            if buddy not in free[k]:
                break
            free[k].remove(buddy)  # its heap entry goes stale
            if not free[k]:
                self._orders &= ~(1 << k)
            addr = min(addr, buddy)
            k += 1
        self._push(k, addr)

    def size_of(self, start: int) -> int:
        return 1 << self._alloc[start]

    def largest_free_extent(self) -> int:
        orders = self._orders
        return 1 << orders.bit_length() - 1 if orders else 0

    def free_extents(self) -> list[tuple[int, int]]:
        """Sorted ``(start, length)`` of every free block. O(free blocks); for tests."""
        return sorted((a, 1 << j) for j, s in enumerate(self._free) for a in s)


class _FitArena(ABC):
    """Free-interval lists with coalescing; subclasses choose the interval."""

    kind = ""
    __slots__ = ("capacity", "free_slots", "_starts", "_len", "_by_len", "_alloc")

    def __init__(self, capacity: int) -> None:
        _check_capacity(capacity)
        self.capacity = capacity
        self.free_slots = capacity
        self._starts: list[int] = [0]  # sorted starts of free intervals
        self._len: dict[int, int] = {0: capacity}  # free interval start -> length
        self._by_len: list[tuple[int, int]] = [(capacity, 0)]  # sorted (length, start)
        self._alloc: dict[int, int] = {}  # allocated start -> length

    @staticmethod
    def taken_size(size: int) -> int:
        """Exact fits take exactly ``size`` slots."""
        _check_size(size)
        return size

    def max_allocation(self) -> int:
        return self.capacity

    @abstractmethod
    def _choose(self, size: int) -> int | None:
        """The start of the free interval a ``size``-slot allocation takes (None: none fits)."""

    def _remove_interval(self, start: int) -> int:
        length = self._len.pop(start)
        del self._starts[bisect_left(self._starts, start)]
        del self._by_len[bisect_left(self._by_len, (length, start))]
        return length

    def _add_interval(self, start: int, length: int) -> None:
        self._len[start] = length
        insort(self._starts, start)
        insort(self._by_len, (length, start))

    def allocate(self, size: int) -> int | None:
        """Start of a new extent of exactly ``size`` slots, or None when no interval fits."""
        _check_size(size)
        if not self._by_len or self._by_len[-1][0] < size:
            return None
        start = self._choose(size)
        length = self._remove_interval(start)
        if length > size:
            self._add_interval(start + size, length - size)
        self._alloc[start] = size
        self.free_slots -= size
        return start

    def free(self, start: int) -> None:
        size = self._alloc.pop(start, None)
        if size is None:
            raise ValueError(f"no extent starts at slot {start}; free only starts returned by "
                             "allocate, once each")
        self.free_slots += size
        end = start + size
        starts = self._starts
        i = bisect_left(starts, start)
        if i < len(starts) and starts[i] == end:  # merge with the next free interval
            size += self._remove_interval(end)
        if i > 0:
            prev = starts[i - 1]
            if prev + self._len[prev] == start:  # merge with the previous free interval
                start, size = prev, self._remove_interval(prev) + size
        self._add_interval(start, size)

    def size_of(self, start: int) -> int:
        return self._alloc[start]

    def largest_free_extent(self) -> int:
        return self._by_len[-1][0] if self._by_len else 0

    def free_extents(self) -> list[tuple[int, int]]:
        """Sorted ``(start, length)`` of every free interval."""
        return [(s, self._len[s]) for s in self._starts]


class FirstFitArena(_FitArena):
    kind = "first_fit"
    __slots__ = ()

    def _choose(self, size: int) -> int:
        ln = self._len
        for s in self._starts:  # O(free intervals)
            if ln[s] >= size:
                return s
        raise AssertionError("unreachable: the largest interval fits")  # pragma: no cover


class BestFitArena(_FitArena):
    kind = "best_fit"
    __slots__ = ()

    def _choose(self, size: int) -> int:
        return self._by_len[bisect_left(self._by_len, (size, -1))][1]  # O(log free intervals)


ARENAS = {"buddy": BuddyArena, "first_fit": FirstFitArena, "best_fit": BestFitArena}

Arena = BuddyArena | FirstFitArena | BestFitArena


def make_arena(kind: str, capacity: int) -> Arena:
    """An arena of ``kind`` (one of ``ARENAS``) over ``capacity`` slots."""
    cls = ARENAS.get(kind)
    if cls is None:
        raise ValueError(f"unknown arena {kind!r}; choose one of {sorted(ARENAS)}")
    return cls(capacity)
