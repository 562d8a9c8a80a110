"""PagedKVCacheManager on tiny pools (11 blocks of 16): exact ids, prefix hits, CoW, swap."""

import numpy as np
import pytest

from pagebench.allocators.registry import PagedKVCacheManager

BS = 16


def toks(start, n):
    return np.arange(start, start + n, dtype=np.int32)


def mgr(**kw):
    kw.setdefault("num_cpu_blocks", 4)
    return PagedKVCacheManager(11, BS, **kw)


def test_blocks_are_allocated_on_demand_as_tokens_arrive():
    m = mgr()
    assert m.admit(1, toks(0, 40), 60, 40).num_cached_tokens == 0
    assert m.block_table(1) == [0, 1, 2]
    assert m.append(1, toks(40, 8)) == []  # fills block 2 exactly: no new block
    assert m.block_table(1) == [0, 1, 2]
    assert m.append(1, [1000]) == []  # token 49 needs a new block
    assert m.block_table(1) == [0, 1, 2, 3]
    assert m.slot_mapping(1, 46, 49) == [2 * BS + 14, 2 * BS + 15, 3 * BS + 0]
    assert m.num_free_blocks == 7


def test_chunked_prefill_admits_part_of_the_prompt():
    m = mgr()
    prompt = toks(0, 40)
    m.admit(1, prompt, 50, 20)
    assert m.block_table(1) == [0, 1] and m.num_tokens(1) == 20
    m.append(1, prompt[20:40])
    assert m.block_table(1) == [0, 1, 2]
    m.free(1)
    # Blocks keyed from chunks match blocks keyed from a whole prompt.
    assert m.admit(2, prompt, 50, 40).num_cached_tokens == 32


def test_free_returns_blocks_tail_first():
    m = mgr(enable_prefix_caching=False)
    m.admit(1, toks(0, 40), 40, 40)  # blocks 0 1 2
    m.admit(2, toks(100, 20), 20, 20)  # blocks 3 4
    m.free(1)
    assert m.pool.free_queue() == [5, 6, 7, 8, 9, 10, 2, 1, 0]
    m.free(2)
    assert m.pool.free_queue() == [5, 6, 7, 8, 9, 10, 2, 1, 0, 4, 3]
    b = m.breakdown(False)
    assert b.allocated_slots == 0 and b.idle == 11 * BS and b.cached_free_slots == 0


def test_prefix_hit_reuses_full_blocks_and_keeps_one_token_to_compute():
    m = mgr()
    prompt = toks(0, 40)
    m.admit(1, prompt, 41, 40)  # blocks 0 1 2; 0 and 1 are full and cached
    assert m.admit(2, prompt, 41, 40).num_cached_tokens == 32
    assert m.block_table(2) == [0, 1, 3]
    assert m.pool.ref_cnt[0] == 2 and m.pool.ref_cnt[2] == 1
    # A 32-token prompt can hit at most 31 tokens: only its first block.
    assert m.admit(3, prompt[:32], 33, 32).num_cached_tokens == 16
    assert m.block_table(3) == [0, 4]
    assert m.stats.prefix_queried_tokens == 112 and m.stats.prefix_hit_tokens == 48
    b = m.breakdown(False)
    assert b.token_states == 40 + 8 + 16  # shared blocks counted once
    assert b.logical_tokens == 40 + 40 + 32


def test_hits_are_chained_and_check_token_ids():
    m = mgr()
    m.admit(1, toks(0, 48), 48, 48)
    other_first = np.concatenate([toks(500, 16), toks(16, 32)])
    assert m.admit(2, other_first, 48, 48).num_cached_tokens == 0  # block 1 differs by parent
    changed_second = np.concatenate([toks(0, 16), toks(900, 32)])
    assert m.admit(3, changed_second, 48, 48).num_cached_tokens == 16


def test_admit_with_fewer_tokens_than_cached_holds_the_cached_tokens():
    m = mgr()
    prompt = toks(0, 64)
    m.admit(1, prompt, 64, 64)
    assert m.admit(2, prompt, 64, 8).num_cached_tokens == 48
    assert m.num_tokens(2) == 48 and m.block_table(2) == [0, 1, 2]


def test_freed_cached_blocks_are_hit_again_and_evicted_lru_tail_first():
    m = mgr(num_cpu_blocks=0)
    a, b = toks(0, 33), toks(1000, 33)
    m.admit(1, a, 33, 33)  # 0 1 2
    m.admit(2, b, 33, 33)  # 3 4 5
    m.free(1)
    m.free(2)
    assert m.pool.free_queue() == [6, 7, 8, 9, 10, 2, 1, 0, 5, 4, 3]
    assert m.breakdown(False).cached_free_slots == 4 * BS
    # A hit pulls cached free blocks out of the queue.
    assert m.admit(3, a, 33, 33).num_cached_tokens == 32
    assert m.block_table(3) == [0, 1, 6]
    m.free(3)
    # Eat the free queue head: 7 8 9 10 2 (uncached) then 5 4 (b's cached blocks, tail first).
    m.admit(4, toks(5000, 7 * BS), 7 * BS, 7 * BS)
    assert m.block_table(4) == [7, 8, 9, 10, 2, 5, 4]
    assert m.pool.free_queue() == [3, 6, 1, 0]
    # b's second block (4) was evicted before its first (3): one block still hits.
    assert m.admit(5, b, 33, 33).num_cached_tokens == 16
    assert m.block_table(5) == [3, 6, 1]  # the new blocks evict a's second block (1)
    m.free(5)
    assert m.pool.free_queue() == [0, 1, 6, 3]
    assert m.admit(6, a, 33, 33).num_cached_tokens == 16
    assert m.block_table(6) == [0, 1, 6]


def test_decode_produced_full_blocks_are_hashed():
    m = mgr()
    m.admit(1, toks(0, 10), 40, 10)
    for t in range(10, 40):
        m.append(1, [t])
    m.free(1)
    assert m.admit(2, toks(0, 40), 41, 40).num_cached_tokens == 32


def test_fork_shares_blocks_and_first_divergent_write_copies_on_write():
    m = mgr()
    m.admit(1, toks(0, 40), 60, 40)  # 0 1 2(8 tokens)
    assert m.fork(1, 2, 60) == []
    assert m.block_table(2) == [0, 1, 2]
    assert [m.pool.ref_cnt[b] for b in (0, 1, 2)] == [2, 2, 2]
    assert m.append(2, [7]) == [(2, 3)]  # child copies the shared partial block
    assert m.block_table(2) == [0, 1, 3] and m.pool.ref_cnt[2] == 1
    assert m.append(1, [9]) == []  # parent now owns block 2 alone: writes in place
    assert m.block_table(1) == [0, 1, 2]
    assert m.stats.cow_copies == 1
    b = m.breakdown(False)
    assert b.token_states == 32 + 9 + 9 and b.logical_tokens == 82


def test_fork_at_a_block_boundary_needs_no_copy():
    m = mgr()
    m.admit(1, toks(0, 32), 50, 32)
    m.fork(1, 2, 50)
    assert m.append(1, [1]) == [] and m.append(2, [2]) == []
    assert m.block_table(1) == [0, 1, 2] and m.block_table(2) == [0, 1, 3]


def test_three_way_fork_copies_twice_and_last_writer_keeps_the_block():
    m = mgr()
    m.admit(1, toks(0, 20), 30, 20)  # 0 1(4)
    m.fork(1, 2, 30)
    m.fork(1, 3, 30)
    assert m.append(1, [1]) == [(1, 2)]
    assert m.append(2, [1]) == [(1, 3)]
    assert m.append(3, [1]) == []
    assert m.block_table(3) == [0, 1]


def test_shared_partial_block_fill_target_is_the_max_over_owners():
    m = mgr()
    m.admit(1, toks(0, 20), 22, 20)  # block 1 holds 4 of 16, parent will fill 6
    m.fork(1, 2, 30)  # child will fill 14
    b = m.breakdown(False)
    assert (b.token_states, b.reserved, b.internal_rounding) == (20, 10, 2)
    m.free(2)
    b = m.breakdown(False)
    assert (b.token_states, b.reserved, b.internal_rounding) == (20, 2, 10)


def test_swap_round_trip():
    m = mgr(num_cpu_blocks=3)
    m.admit(1, toks(0, 40), 50, 40)  # 0 1 2
    assert m.swap_out(1) == [(0, 0), (1, 1), (2, 2)]
    assert m.is_swapped(1) and m.num_free_blocks == 11 and m.num_free_cpu_blocks == 0
    assert m.breakdown(False).logical_tokens == 0
    with pytest.raises(ValueError, match="swapped out"):
        m.append(1, [1])
    m.admit(2, toks(100, 16), 16, 16)  # takes block 3
    assert m.swap_in(1) == [(0, 4), (1, 5), (2, 6)]
    assert m.block_table(1) == [4, 5, 6] and m.num_free_cpu_blocks == 3
    assert m.append(1, [5]) == []
    b = m.breakdown(False)
    assert b.token_states == 41 + 16 and b.logical_tokens == 57
    assert m.stats.swap_outs == 1 and m.stats.swap_ins == 1 and m.stats.swapped_out_units == 3


def test_swap_out_without_cpu_room_and_swap_in_without_device_room_return_none():
    m = mgr(num_cpu_blocks=2)
    m.admit(1, toks(0, 40), 40, 40)
    assert m.swap_out(1) is None and m.block_table(1) == [0, 1, 2]
    m.free(1)
    m.admit(2, toks(0, 20), 20, 20)
    assert m.swap_out(2) is not None
    m.admit(3, toks(500, 11 * BS), 11 * BS, 11 * BS)
    assert m.swap_in(2) is None and m.is_swapped(2) and m.num_free_cpu_blocks == 0
    m.free(2)
    assert m.num_free_cpu_blocks == 2


def test_out_of_memory_returns_none_and_leaves_no_partial_state():
    m = mgr()
    m.admit(1, toks(0, 150), 300, 150)  # 10 blocks
    assert m.admit(2, toks(900, 17), 17, 17) is None
    assert 2 not in m and m.pool.free_queue() == [10]
    m.append(1, toks(150, 10))  # fills block 9 (160 tokens)
    assert m.append(1, toks(160, 17)) is None  # needs 2 blocks, 1 free
    assert m.num_tokens(1) == 160 and len(m.block_table(1)) == 10
    assert m.pool.free_queue() == [10]
    m.fork(1, 3, 300)
    assert m.append(1, [1]) == [] and m.block_table(1)[-1] == 10
    assert m.append(3, [1]) is None  # needs a block, none free
    assert m.append(1, [2]) == []  # the parent's own partial block still has room
    m.fork(1, 4, 300)
    assert m.append(4, [3]) is None  # copy-on-write needs a block too
    assert m.block_table(4) == m.block_table(1) and m.stats.cow_copies == 0
    b = m.breakdown(True)
    assert b.token_states == 162 and b.external_fragmentation == 0


def test_oom_admit_does_not_pull_cached_hits_out_of_the_queue():
    m = mgr()
    m.admit(1, toks(0, 33), 33, 33)
    m.free(1)
    m.admit(2, toks(1000, 8 * BS), 8 * BS, 8 * BS)
    queue = m.pool.free_queue()
    assert m.admit(3, toks(0, 100), 100, 100) is None  # 2 hits + 5 new > 3 free
    assert m.pool.free_queue() == queue and m.stats.prefix_hit_tokens == 0


def test_misuse_raises_value_errors_that_say_how_to_fix():
    with pytest.raises(ValueError, match="block_size"):
        PagedKVCacheManager(11, 0)
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCacheManager(0, 16)
    m = mgr()
    with pytest.raises(ValueError, match="unknown seq_id"):
        m.append(7, [1])
    with pytest.raises(ValueError, match="unknown seq_id"):
        m.free(7)
    m.admit(1, toks(0, 10), 12, 10)
    with pytest.raises(ValueError, match="already admitted"):
        m.admit(1, toks(0, 10), 12, 10)
    with pytest.raises(ValueError, match="final_len"):
        m.append(1, [1, 2, 3])
    with pytest.raises(ValueError, match="num_tokens"):
        m.admit(2, toks(0, 10), 12, 11)
    with pytest.raises(ValueError, match="final_len"):
        m.admit(3, toks(0, 10), 9, 10)
    with pytest.raises(ValueError, match="not swapped out"):
        m.swap_in(1)
    with pytest.raises(ValueError, match="already exists"):
        m.fork(1, 1, 12)


def test_fits_empty_pool():
    m = mgr()
    assert m.fits_empty_pool(10, 176) and not m.fits_empty_pool(10, 177)


def test_can_append_without_copy_flags_a_shared_partial_last_block():
    m = mgr()
    m.admit(1, toks(0, 20), 40, 20)
    assert m.can_append_without_copy(1)
    m.fork(1, 2, 40)
    assert not m.can_append_without_copy(1) and not m.can_append_without_copy(2)
    m.append(2, [1])
    assert m.can_append_without_copy(1) and m.can_append_without_copy(2)


def test_bulk_append_across_blocks_takes_the_queue_head_in_order():
    m = mgr()
    m.admit(1, toks(0, 33), 33, 33)
    m.free(1)  # queue: 3..10, 2, 1(cached), 0(cached)
    assert m.pool.cached_flags_at_head(11) == [False] * 9 + [True, True]
    m.admit(2, toks(500, 5), 200, 5)  # block 3
    assert m.append(2, toks(505, 100)) == []
    assert m.block_table(2) == [3, 4, 5, 6, 7, 8, 9]
    assert m.num_free_blocks == 4 and m.breakdown(False).cached_free_slots == 2 * BS


def test_allocators_import_no_torch():
    import subprocess
    import sys
    code = "import sys, allocators; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
