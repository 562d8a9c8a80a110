"""ContiguousKVCacheManager: reservation policies, arena rounding, fork copies, swap."""

import pytest

from pagebench.allocators.registry import ContiguousKVCacheManager, make_manager


def cm(policy="oracle", arena="first_fit", capacity=1024, max_model_len=256, **kw):
    return ContiguousKVCacheManager(capacity, policy=policy, max_model_len=max_model_len,
                                    arena=arena, **kw)


def test_reservation_policies():
    assert cm("max").reservation(10, 34) == 256
    assert cm("oracle").reservation(10, 34) == 34
    # pow2: true output 25 (final 34 = 10 + 25 - 1) -> 32 output tokens -> 31 KV slots.
    assert cm("pow2").reservation(10, 34) == 10 + 31
    assert cm("pow2").reservation(10, 10) == 10  # output 1: no output KV
    assert cm("pow2").reservation(200, 250) == 256  # capped at max_model_len


def test_pow2_over_reserves_output_kv_by_less_than_2x():
    m = cm("pow2", max_model_len=10**6)
    for out in range(2, 3000):
        extra = m.reservation(7, 7 + out - 1) - 7
        assert out - 1 <= extra < 2 * (out - 1)


def test_breakdown_splits_over_reservation_and_buddy_rounding():
    m = cm("pow2", arena="buddy")
    m.admit(1, list(range(10)), 34, 10)  # reservation 41, buddy takes 64
    b = m.breakdown(False)
    assert (b.token_states, b.reserved, b.internal_over_reservation, b.internal_rounding) == (10, 24, 7, 23)
    assert b.allocated_slots == 64 and b.idle == 1024 - 64
    assert m.slot_range(1) == (0, 41)
    assert m.append(1, [1, 2]) == []
    assert m.slot_mapping(1, 10, 12) == [10, 11]
    assert m.breakdown(True).external_fragmentation == 1024 - 64


def test_admit_places_extents_and_returns_none_when_nothing_fits():
    m = cm("max", capacity=600)
    assert m.admit(1, [1], 5, 1).num_cached_tokens == 0
    assert m.admit(2, [1], 5, 1) is not None
    assert m.slot_range(2) == (256, 256)
    assert m.admit(3, [1], 5, 1) is None and 3 not in m
    b = m.breakdown(True)
    assert b.largest_free_extent == 88 and b.external_fragmentation == 88


def test_fork_reserves_for_the_child_and_copies_written_slots():
    m = cm("oracle")
    m.admit(1, [5, 6, 7], 8, 3)
    m.append(1, [8])
    assert m.fork(1, 2, 10) == [(0, 8), (1, 9), (2, 10), (3, 11)]
    assert m.slot_range(2) == (8, 10) and m.num_tokens(2) == 4
    assert m.stats.fork_copies == 4
    b = m.breakdown(False)
    assert b.token_states == 8 and b.reserved == 4 + 6 and b.logical_tokens == 8
    small = cm("oracle", capacity=10)
    small.admit(1, [1, 2], 8, 2)
    assert small.fork(1, 2, 8) is None and 2 not in small


def test_swap_round_trip_re_places_the_reservation():
    m = cm("oracle", capacity=40, num_cpu_slots=8)
    m.admit(1, [1, 2, 3], 10, 3)
    m.admit(2, [1, 2, 3], 10, 3)
    assert m.swap_out(1) == [(0, 0), (1, 1), (2, 2)]
    assert m.is_swapped(1) and m.breakdown(False).allocated_slots == 10
    m.admit(3, [1], 10, 1)  # takes [0, 10)
    assert m.swap_in(1) == [(0, 20), (1, 21), (2, 22)]
    assert m.slot_range(1) == (20, 10)
    assert m.stats.swap_outs == m.stats.swap_ins == 1 and m.stats.swapped_in_units == 3


def test_swap_without_room_returns_none():
    m = cm("oracle", capacity=20)
    m.admit(1, [1, 2, 3], 10, 3)
    assert m.swap_out(1) is None  # no CPU slots
    m2 = cm("oracle", capacity=20, num_cpu_slots=5)
    m2.admit(1, [1, 2, 3], 20, 3)
    assert m2.swap_out(1) is not None
    m2.admit(2, [1], 5, 1)
    assert m2.swap_in(1) is None and m2.is_swapped(1)
    m2.free(1)
    assert m2.breakdown(False).allocated_slots == 5


def test_misuse_raises_value_errors():
    with pytest.raises(ValueError, match="policy"):
        cm("lifo")
    with pytest.raises(ValueError, match="arena"):
        cm(arena="slab")
    with pytest.raises(ValueError, match="capacity_slots"):
        cm(capacity=0)
    m = cm()
    with pytest.raises(ValueError, match="unknown seq_id"):
        m.append(3, [1])
    m.admit(1, [1, 2], 3, 2)
    with pytest.raises(ValueError, match="already admitted"):
        m.admit(1, [1, 2], 3, 2)
    with pytest.raises(ValueError, match="final_len"):
        m.append(1, [1, 2])
    with pytest.raises(ValueError, match="max_model_len"):
        m.admit(2, [1], 257, 1)
    assert not m.fits_empty_pool(1, 257) and m.fits_empty_pool(1, 256)
    assert not cm("max", capacity=255).fits_empty_pool(1, 2)


def test_registry_builds_both_managers_and_rejects_bad_kinds():
    assert make_manager("paged", num_blocks=4, block_size=16).capacity_slots == 64
    assert make_manager("contiguous", capacity_slots=64, policy="max",
                        max_model_len=32).name == "contiguous_max"
    with pytest.raises(ValueError, match="contiguous.*paged"):
        make_manager("slab")
    with pytest.raises(ValueError, match="does not take"):
        make_manager("paged", num_blocks=4, block_size=16, policy="max")
    with pytest.raises(ValueError, match="needs"):
        make_manager("contiguous", capacity_slots=64)


def _state(m, seq_ids):
    """What a contiguous manager shows of its sequences: tokens, breakdown, copies."""
    return ([m.num_tokens(s) for s in seq_ids], m.breakdown(True),
            [m.slot_mapping(s, 0, m.num_tokens(s)) for s in seq_ids])


@pytest.mark.parametrize("policy", ["max", "pow2", "oracle"])
def test_advance_all_equals_append_batch_through_later_operations(policy):
    """``advance_all`` (fast-forward's O(1) append) leaves every figure as ``append_batch``
    of the same counts does, and so do the appends, forks, swaps and frees after it."""
    managers = [cm(policy, arena="buddy", capacity=4096, num_cpu_slots=1024) for _ in range(2)]
    batch, bulk = managers
    for m in managers:
        for seq_id, (prompt, final) in enumerate([(10, 40), (3, 90), (25, 32)]):
            m.admit(seq_id, list(range(prompt)), final, prompt)
    assert batch.append_batch([0, 1, 2], [range(4)] * 3, []) == 3
    assert bulk.advance_all(4, 3)
    assert _state(batch, [0, 1, 2]) == _state(bulk, [0, 1, 2])
    for m in managers:  # later operations read the shifted positions
        assert m.append_decode([0, 1, 2], [7, 7, 7], []) == 3
        m.append(1, [5, 5])
        assert m.fork(0, 7, 40) is not None
        assert m.swap_out(2) is not None
        m.free(0)
    assert _state(batch, [1, 7]) == _state(bulk, [1, 7])
    assert not bulk.advance_all(1, 2)  # seq 2 is swapped out: nothing moves
    assert _state(batch, [1, 7]) == _state(bulk, [1, 7])
    for m in managers:
        assert m.swap_in(2) is not None
        m.append(2, [1])
    assert _state(batch, [1, 2, 7]) == _state(bulk, [1, 2, 7])
    assert not bulk.advance_all(1, 2)  # it holds three sequences, not two
    assert batch.append_batch([1, 2, 7], [range(1)] * 3, []) == 3 and bulk.advance_all(1, 3)
    assert _state(batch, [1, 2, 7]) == _state(bulk, [1, 2, 7])
    with pytest.raises(ValueError, match="exceeds its final_len"):
        bulk.append(2, [1])  # seq 2 (final 32) is full: the shifted check still holds
