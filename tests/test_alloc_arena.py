"""Arenas: exact offsets for buddy / first fit / best fit, coalescing, largest free extent."""

import numpy as np
import pytest

from pagebench.allocators.arena import ARENAS, BuddyArena, make_arena


def test_buddy_rounds_up_and_splits_lowest_address_first():
    a = BuddyArena(64)
    assert a.taken_size(5) == 8 and a.taken_size(8) == 8 and a.taken_size(1) == 1
    assert a.allocate(5) == 0  # 64 -> 32 | 32 -> 16 | 16 -> 8 | 8
    assert a.free_extents() == [(8, 8), (16, 16), (32, 32)]
    assert a.allocate(16) == 16
    assert a.allocate(8) == 8
    assert a.allocate(3) == 32  # 4 slots
    assert a.size_of(32) == 4 and a.free_slots == 64 - 8 - 16 - 8 - 4
    assert a.free_extents() == [(36, 4), (40, 8), (48, 16)]
    assert a.largest_free_extent() == 16
    assert a.allocate(32) is None


def test_buddy_coalesces_buddies_back_to_the_root():
    a = BuddyArena(64)
    starts = [a.allocate(16) for _ in range(4)]
    assert starts == [0, 16, 32, 48] and a.largest_free_extent() == 0
    a.free(16)
    a.free(32)  # 16 and 32 are adjacent but not buddies
    assert a.free_extents() == [(16, 16), (32, 16)] and a.largest_free_extent() == 16
    a.free(0)
    assert a.free_extents() == [(0, 32), (32, 16)]
    a.free(48)
    assert a.free_extents() == [(0, 64)] and a.free_slots == 64


def test_buddy_non_power_of_two_capacity_uses_maximal_roots():
    a = BuddyArena(1000)
    assert a.free_extents() == [(0, 512), (512, 256), (768, 128), (896, 64), (960, 32), (992, 8)]
    assert a.max_allocation() == 512 and a.largest_free_extent() == 512
    assert a.allocate(40) == 896  # the smallest free block that fits (64)
    assert a.allocate(300) == 0
    assert a.allocate(300) is None
    a.free(896)
    a.free(0)
    assert a.free_extents()[0] == (0, 512) and a.free_slots == 1000
    # Roots never merge with their neighbours.
    assert len(a.free_extents()) == 6


def test_first_fit_and_best_fit_pick_different_holes():
    for kind, expected in (("first_fit", 10), ("best_fit", 70)):
        a = make_arena(kind, 100)
        assert [a.allocate(n) for n in (10, 30, 30, 20, 10)] == [0, 10, 40, 70, 90]
        a.free(10)  # hole [10, 40) of 30
        a.free(70)  # hole [70, 90) of 20
        assert a.free_extents() == [(10, 30), (70, 20)]
        assert a.allocate(15) == expected, kind
        assert a.taken_size(15) == 15


def test_fit_arenas_coalesce_with_both_neighbours():
    for kind in ("first_fit", "best_fit"):
        a = make_arena(kind, 100)
        for n in (10, 20, 30):
            a.allocate(n)
        assert a.free_extents() == [(60, 40)]
        a.free(0)
        a.free(30)
        assert a.free_extents() == [(0, 10), (30, 70)]
        assert a.largest_free_extent() == 70
        a.free(10)  # joins [0,10) and [30,100)
        assert a.free_extents() == [(0, 100)] and a.free_slots == 100
        assert a.largest_free_extent() == 100


def test_fit_arena_full_and_exact():
    a = make_arena("first_fit", 10)
    assert a.allocate(10) == 0 and a.largest_free_extent() == 0 and a.allocate(1) is None
    a.free(0)
    assert a.allocate(11) is None and a.allocate(10) == 0


def test_unknown_arena_lists_the_valid_kinds():
    with pytest.raises(ValueError, match="best_fit.*buddy.*first_fit"):
        make_arena("worst_fit", 10)


@pytest.mark.parametrize("kind", sorted(ARENAS))
def test_arena_misuse_is_a_value_error(kind):
    with pytest.raises(ValueError, match="capacity"):
        make_arena(kind, 0)
    a = make_arena(kind, 16)
    with pytest.raises(ValueError, match="size"):
        a.allocate(0)
    start = a.allocate(4)
    a.free(start)
    with pytest.raises(ValueError, match="once each"):
        a.free(start)


class _ScanningBuddy(BuddyArena):
    """The buddy arena finding orders by scanning its free sets (the index-free reference)."""

    __slots__ = ()

    def allocate(self, size: int) -> int | None:
        k = (size - 1).bit_length()
        j = k
        while j < len(self._free) and not self._free[j]:
            j += 1
        if j >= len(self._free):
            return None
        addr = self._pop_lowest(j)
        while j > k:
            j -= 1
            self._push(j, addr + (1 << j))
        self._alloc[addr] = k
        self.free_slots -= 1 << k
        return addr

    def largest_free_extent(self) -> int:
        return max((1 << j for j, s in enumerate(self._free) if s), default=0)


@pytest.mark.parametrize("capacity", [1000, 1024, 4097])
def test_buddy_order_index_matches_a_scan_of_the_free_sets(capacity):
    rng = np.random.default_rng(capacity)
    fast, slow = BuddyArena(capacity), _ScanningBuddy(capacity)
    live: list[int] = []
    refused = 0
    for _ in range(3000):
        if live and rng.random() < 0.45:
            start = live.pop(int(rng.integers(len(live))))
            fast.free(start)
            slow.free(start)
        else:
            size = int(rng.integers(1, capacity // 3))
            start = fast.allocate(size)
            assert start == slow.allocate(size)
            if start is None:
                refused += 1
            else:
                live.append(start)
        assert fast.largest_free_extent() == slow.largest_free_extent()
        assert fast.free_extents() == slow.free_extents()
    assert refused > 100 and len(live) > 0
