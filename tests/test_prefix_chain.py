"""Prefix-cache internals: the chained block keys and the pool's batch operations.

The batch forms (``touch_many``, ``register_many``, bulk ``free``) must leave the pool
exactly as the one-block forms do; the keys of a prompt must not depend on how it is
computed (numpy or Python, at once or chunk by chunk); the memoised prefix hits must
equal a fresh lookup.
"""

import random
from array import array

import numpy as np
import pytest

import pagebench.allocators.block_pool as block_pool
import pagebench.allocators.prefix_keys as prefix_keys
from pagebench.allocators.registry import PagedKVCacheManager
from pagebench.allocators.block_pool import BlockPool

BS = 16
W = 4 * BS


def keys_of(parent, data, count, vector):
    """``chain_keys``, forced onto the numpy or the Python path."""
    saved = prefix_keys.VECTOR_MIN_BLOCKS
    prefix_keys.VECTOR_MIN_BLOCKS = 1 if vector else 10**9
    try:
        return prefix_keys.chain_keys(parent, data, 0, count, W)
    finally:
        prefix_keys.VECTOR_MIN_BLOCKS = saved


@pytest.mark.parametrize("count", [1, 2, 17, 128, 300])
@pytest.mark.parametrize("parent", [0, 1, (1 << 64) - 1, 0x1234_5678_9ABC_DEF0])
def test_numpy_and_python_chains_agree(count, parent):
    data = np.random.default_rng(count).integers(0, 1 << 30, count * BS, dtype=np.int32).tobytes()
    assert keys_of(parent, data, count, vector=True) == keys_of(parent, data, count, vector=False)


def test_a_chain_split_anywhere_continues_from_the_last_key():
    data = np.random.default_rng(0).integers(0, 1 << 30, 200 * BS, dtype=np.int32).tobytes()
    whole = keys_of(0, data, 200, vector=True)
    for split in (1, 63, 150):
        rest = keys_of(whole[split - 1], data[split * W:], 200 - split, vector=split % 2 == 0)
        assert whole[:split] + rest == whole
    # H_j = H_{j-1} * MUL + hash(block j) mod 2**64, from H_{-1} = 0
    expected, parent = [], 0
    for i in range(200):
        parent = (parent * prefix_keys.MUL + hash(data[i * W:(i + 1) * W])) % 2**64
        expected.append(parent)
    assert whole == expected


def test_equal_blocks_after_different_prefixes_get_different_keys():
    rng = np.random.default_rng(2)
    shared = rng.integers(0, 1 << 30, BS, dtype=np.int32).tobytes()
    a = keys_of(0, rng.integers(0, 1 << 30, BS, dtype=np.int32).tobytes() + shared, 2, False)
    b = keys_of(0, rng.integers(0, 1 << 30, BS, dtype=np.int32).tobytes() + shared, 2, False)
    assert a[1] != b[1] and keys_of(a[0], shared, 1, False) == [a[1]]


def registered(m):
    return {b: m.pool.key_of(b) for b in range(m.num_blocks) if m.pool.key_of(b) is not None}


@pytest.mark.parametrize("chunk", [16, 100, 2048])
def test_chunked_prefill_keys_the_blocks_as_a_whole_admission_does(chunk):
    prompt = np.random.default_rng(1).integers(0, 1 << 29, 3000, dtype=np.int32)
    whole = PagedKVCacheManager(400, BS)
    whole.admit(1, prompt, 3100, 3000)
    parts = PagedKVCacheManager(400, BS)
    parts.admit(1, prompt, 3100, chunk)
    for start in range(chunk, 3000, chunk):
        parts.append(1, prompt[start:start + chunk])
    assert parts.block_table(1) == whole.block_table(1)
    assert registered(parts) == registered(whole)


def test_appending_other_tokens_than_admitted_keys_the_tokens_appended():
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, 1 << 29, 800, dtype=np.int32)
    other = np.concatenate([prompt[:200], rng.integers(0, 1 << 29, 600, dtype=np.int32)])
    m = PagedKVCacheManager(200, BS)
    m.admit(1, prompt, 900, 200)
    m.append(1, other[200:])
    ref = PagedKVCacheManager(200, BS)
    ref.admit(1, other, 900, 800)
    assert registered(m) == registered(ref)


def check_same(a: BlockPool, b: BlockPool) -> None:
    assert a.free_queue() == b.free_queue()
    assert list(a.ref_cnt) == list(b.ref_cnt)
    assert [a.key_of(x) for x in range(a.num_blocks)] == [b.key_of(x) for x in range(b.num_blocks)]
    assert (a.num_free, a.num_cached_free, a.num_evictions, a.num_cached_blocks) == \
        (b.num_free, b.num_cached_free, b.num_evictions, b.num_cached_blocks)
    assert a.num_free == len(a.free_queue())
    assert a.num_cached_free == sum(a.key_of(x) is not None for x in a.free_queue())


@pytest.mark.parametrize("seed", range(4))
def test_batch_operations_equal_one_block_operations(seed, monkeypatch):
    """Random requests allocate, register (with repeated contents), share, hit free
    cached blocks and free: long enough to compact the queue and trim the eviction log."""
    monkeypatch.setattr(block_pool, "_COMPACT_MIN", 64)
    rng = random.Random(seed)
    n = 300
    bulk, single = BlockPool(n), BlockPool(n)
    tables = []
    for step in range(1500):
        op = rng.random()
        if op < 0.4 and bulk.num_free:
            k = rng.randint(1, min(90, bulk.num_free))
            got = bulk.allocate(k)
            assert single.allocate(k) == got
            keys = [(rng.randrange(4), bytes([rng.randrange(256)])) for _ in got]
            bulk.register_many(got, keys)
            for b, key in zip(got, keys):
                single.register(b, key)
            tables.append(got)
        elif (op < 0.7 or bulk.num_free < 90) and tables:
            table = tables.pop(rng.randrange(len(tables)))
            bulk.free(table[::-1])
            for b in reversed(table):
                single.free([b])
        elif op < 0.85:
            hits = [b for b in rng.sample(range(n), 40) if bulk.key_of(b) is not None]
            bulk.touch_many(hits)
            for b in hits:
                single.touch(b)
            tables.append(hits)
        elif tables:  # a second owner of a whole table (a fork)
            table = rng.choice(tables)
            bulk.touch_many(table)
            for b in table:
                single.touch(b)
            tables.append(list(table))
        check_same(bulk, single)
        evicted = bulk.num_evictions
        since = bulk.evicted_since(evicted - 5)
        assert since is None or since == single.evicted_since(evicted - 5)
    assert bulk.num_evictions > 3 * n and bulk.evicted_since(0) is None  # the log was trimmed


def test_evicted_since_lists_the_blocks_whose_key_was_dropped():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    pool.register_many(blocks, [(0, bytes([i])) for i in range(4)])
    pool.free(blocks[::-1])
    mark = pool.num_evictions
    assert pool.evicted_since(mark) == []
    assert pool.allocate(2) == [3, 2]
    assert pool.evicted_since(mark) == [3, 2] and pool.num_cached_free == 2


def test_memoised_prefix_hits_equal_a_fresh_lookup(monkeypatch):
    """A waiting prompt is asked about again and again while running requests grow and
    end (evicting its cached blocks, and registering them again): the memoised answer
    must equal a fresh lookup."""
    monkeypatch.setattr(block_pool, "_COMPACT_MIN", 64)  # trim the eviction log often
    rng = np.random.default_rng(3)
    waiting = rng.integers(0, 1 << 29, 2000, dtype=np.int32)
    m = PagedKVCacheManager(200, BS)
    running, sid = {}, 0
    for step in range(400):
        if len(running) < 3 or rng.random() < 0.05:  # a new request sharing a prefix
            sid += 1
            prompt = np.concatenate([waiting[:int(rng.integers(16, 2000))],
                                     rng.integers(0, 1 << 29, 50, dtype=np.int32)])
            if m.admit(sid, prompt, len(prompt) + 4000, len(prompt)) is not None:
                running[sid] = 0
        victim = int(rng.choice(list(running))) if running else None
        if victim is not None and (running[victim] > 30 or rng.random() < 0.1):
            m.free(victim)
            del running[victim]
        elif victim is not None:
            if m.append(victim, rng.integers(0, 1 << 29, 40, dtype=np.int32)) is None:
                m.free(victim)
                del running[victim]
            else:
                running[victim] += 1
        memo = m.cached_prefix_tokens(waiting)
        kept, m._last_prompt = m._last_prompt, None
        assert memo == m.cached_prefix_tokens(waiting)  # a fresh lookup
        m._last_prompt = kept


def test_a_memo_older_than_the_eviction_log_is_looked_up_again(monkeypatch):
    monkeypatch.setattr(block_pool, "_COMPACT_MIN", 16)
    rng = np.random.default_rng(4)
    waiting = rng.integers(0, 1 << 29, 480, dtype=np.int32)  # 30 full blocks
    m = PagedKVCacheManager(50, BS)
    m.admit(1, waiting, 500, 480)
    m.free(1)
    assert m.cached_prefix_tokens(waiting) == 29 * BS  # at least one token to compute
    kept = m._last_prompt
    for sid in range(2, 22):  # other requests evict every cached block, many times over
        m.admit(sid, rng.integers(0, 1 << 29, 640, dtype=np.int32), 650, 640)
        m.free(sid)
    m._last_prompt = kept
    assert m.pool.evicted_since(kept.evictions) is None
    assert m.cached_prefix_tokens(waiting) == 0


def test_the_prompt_memo_trusts_identity_only_for_read_only_ids():
    m = PagedKVCacheManager(64, BS)
    frozen = np.arange(100, dtype=np.int32)
    frozen.setflags(write=False)
    chain = m._prompt(frozen)
    assert m._prompt(frozen) is chain  # the same read-only array: no byte comparison needed
    ids = np.arange(100, dtype=np.int32)  # writeable, same ids: the memo, found by its bytes
    assert m._prompt(ids) is chain
    ids[0] = 7  # changed in place since: a new chain
    changed = m._prompt(ids)
    assert changed is not chain and changed.data == ids.tobytes()
    assert m._prompt(frozen) is not changed and m._prompt(frozen).data == frozen.tobytes()


@pytest.mark.parametrize("ids", [range(1 << 30, (1 << 30) + 32), range(5, 5), range(9, 3),
                                 range(-7, 40), range((1 << 31) - 4, 1 << 31),
                                 range(-(1 << 31), -(1 << 31) + 3), range(0, 64, 3)])
def test_extend_tokens_lays_a_range_out_as_array_extend_does(ids):
    """A range's ids laid out by numpy (the fast path) are array("i").extend's."""
    laid, extended = array("i", [1, 2]), array("i", [1, 2])
    prefix_keys.extend_tokens(laid, ids)
    extended.extend(ids)
    assert laid.tobytes() == extended.tobytes()


@pytest.mark.parametrize("ids", [range((1 << 31) - 2, (1 << 31) + 2),
                                 range(-(1 << 31) - 1, -(1 << 31) + 2)])
def test_extend_tokens_refuses_a_range_beyond_int32_as_array_extend_does(ids):
    """numpy would wrap ids beyond int32: such a range goes to ``extend``, which refuses."""
    with pytest.raises(OverflowError):
        prefix_keys.extend_tokens(array("i"), ids)


@pytest.mark.parametrize("first, count", [(1 << 30, 16), (1 << 30, 1), (0, 0), (0, 17),
                                          (12_345, 100), ((1 << 31) - 16, 16),
                                          ((1 << 31) - 1, 1), ((1 << 30) + 987_654, 48),
                                          ((1 << 30) + 5, 49), ((1 << 31) - 300, 300)])
def test_run_bytes_are_the_ids_packed_as_an_int_array(first, count):
    """A run of consecutive ids packed by ``run_bytes`` (integer lanes, or numpy past
    ``_RUN_INT_MAX``) is array("i")'s bytes of the same ids, up to the largest int32."""
    assert prefix_keys.run_bytes(first, count) == array("i", range(first, first + count)).tobytes()
