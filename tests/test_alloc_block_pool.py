"""BlockPool: exact block ids, free-queue order, LRU eviction of cached blocks."""

import copy
import pickle
import random

import pytest

from pagebench.allocators import block_pool
from pagebench.allocators.block_pool import BlockPool
from pagebench.allocators.residency import ResidencyLog


def test_initial_free_queue_is_ascending_and_allocation_pops_the_head():
    pool = BlockPool(11)
    assert pool.free_queue() == list(range(11))
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.free_queue() == list(range(3, 11))
    assert pool.num_free == 8
    assert [pool.ref_cnt[b] for b in (0, 1, 2, 3)] == [1, 1, 1, 0]


def test_allocate_more_than_free_returns_none_and_changes_nothing():
    pool = BlockPool(4)
    pool.allocate(3)
    assert pool.allocate(2) is None
    assert pool.free_queue() == [3]
    assert pool.num_free == 1


def test_freed_blocks_join_the_tail_in_the_given_order():
    pool = BlockPool(6)
    blocks = pool.allocate(4)
    pool.free(reversed(blocks))  # a request's blocks, tail first
    assert pool.free_queue() == [4, 5, 3, 2, 1, 0]
    assert pool.allocate(3) == [4, 5, 3]


def test_shared_block_returns_to_the_queue_only_at_ref_zero():
    pool = BlockPool(3)
    (b,) = pool.allocate(1)
    pool.touch(b)
    assert pool.ref_cnt[b] == 2
    pool.free([b])
    assert pool.free_queue() == [1, 2]
    pool.free([b])
    assert pool.free_queue() == [1, 2, 0]


def test_touch_removes_a_free_block_from_the_middle_of_the_queue():
    pool = BlockPool(5)
    pool.touch(2)
    assert pool.free_queue() == [0, 1, 3, 4]
    assert pool.num_free == 4 and pool.ref_cnt[2] == 1
    pool.touch(0)
    pool.touch(4)
    assert pool.free_queue() == [1, 3]
    assert pool.allocate(2) == [1, 3]
    assert pool.free_queue() == [] and pool.allocate(1) is None


def test_cached_blocks_keep_their_key_when_freed_until_popped_least_recently_freed_first():
    pool = BlockPool(4)
    a, b, c, d = pool.allocate(4)
    for blk, name in ((a, b"a"), (b, b"b"), (c, b"c")):
        assert pool.register(blk, (0, name))
    pool.free([b])
    pool.free([a])
    pool.free([c, d])
    assert pool.free_queue() == [b, a, c, d]
    assert pool.num_cached_free == 3 and pool.num_cached_blocks == 3
    assert pool.lookup((0, b"a")) == a
    (first,) = pool.allocate(1)  # evicts b, the least recently freed
    assert first == b and pool.lookup((0, b"b")) is None and pool.key_of(b) is None
    assert pool.num_cached_free == 2
    pool.touch(c)  # a hit on a free cached block keeps its key
    assert pool.lookup((0, b"c")) == c and pool.num_cached_free == 1
    assert pool.free_queue() == [a, d]


def test_register_keeps_one_block_per_key():
    pool = BlockPool(2)
    x, y = pool.allocate(2)
    assert pool.register(x, (0, b"t"))
    assert not pool.register(y, (0, b"t"))
    assert pool.lookup((0, b"t")) == x and pool.key_of(y) is None


@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_bad_pool_size_is_a_value_error(bad):
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(bad)


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))])
def test_a_copied_pool_works_on_its_own_buffers(clone):
    """The bulk operations go through numpy views of the pool's buffers: a copy must get
    views of its own buffers (not copies of the original's views)."""
    n = block_pool._BULK_MIN  # blocks in the table: enough to go through the views
    pool = BlockPool(n + 60)
    table = pool.allocate(n)
    pool.register_many(table, list(range(n)))
    twin = clone(pool)
    twin.free(table[::-1])
    assert twin.num_free == n + 60 and list(twin.ref_cnt) == [0] * (n + 60)
    assert twin.free_queue() == list(range(n, n + 60)) + table[::-1]
    assert twin.num_cached_free == n and twin.allocate(n + 60) is not None
    assert list(twin.ref_cnt) == [1] * (n + 60) and twin.num_cached_blocks == 0
    assert pool.num_free == 60 and list(pool.ref_cnt) == [1] * n + [0] * 60  # untouched
    assert pool.num_cached_blocks == n and pool.lookup(7) == table[7]


class _CountingList(list):
    """A list that counts the entries read through indexing (a slice counts its length)."""

    reads = 0

    def __getitem__(self, index):
        item = super().__getitem__(index)
        self.reads += len(item) if isinstance(index, slice) else 1
        return item


@pytest.mark.parametrize("num_blocks", [64, 1 << 16])
def test_cached_flags_at_head_reads_only_the_entries_it_reports_whatever_the_pool_size(num_blocks):
    # Fast-forward asks for the next few blocks' cache flags once per span: the work must
    # be those few queue entries (plus the tombstones passed), never a copy of the queue.
    pool = BlockPool(num_blocks)
    taken = pool.allocate(3)
    pool.register(taken[1], key=7)
    pool.free(taken)  # the queue: 3 .. n-1, then 0, 1 (cached), 2
    pool.touch(5)  # a tombstone near the head
    pool._q = _CountingList(pool._q)
    assert pool.cached_flags_at_head(4) == [False, False, False, False]  # blocks 3, 4, 6, 7
    assert pool._q.reads == 5  # 4 blocks and the tombstone of block 5
    assert pool.free_queue()[-3:] == [0, 1, 2]
    pool._q.reads = 0
    assert pool.cached_flags_at_head(2) == [False, False]
    assert pool._q.reads == 2


def _pool_state(pool: BlockPool) -> tuple:
    return (pool.free_queue(), list(pool.ref_cnt), list(pool._keys), dict(pool._cached),
            bytes(pool._held), pool.num_free, pool.num_cached_free, pool.num_evictions,
            list(pool.residency.lifetimes), list(pool.residency.idle_before_evict),
            list(pool.residency.reuse_gaps))


@pytest.mark.parametrize("bulk_name", ["_BULK_MIN", "_SOLE_BULK_MIN"])
def test_the_bulk_paths_leave_the_pool_as_the_block_by_block_ones(monkeypatch, bulk_name):
    """free / touch_many / register_many through the numpy views (every call: _BULK_MIN 1;
    or only frees of sole references: _SOLE_BULK_MIN 1) and block by block (never), on the
    same random calls: the same pool."""
    from pagebench.allocators import residency as residency_module
    rng = random.Random(5)
    pools = {}
    for bulk in (1, 1 << 30):
        pool = BlockPool(64)
        pool.residency = ResidencyLog(64)
        pools[bulk] = pool
    tables: list[list[int]] = []  # the tables taken, each one reference to its blocks
    next_key = 0
    for step in range(300):
        op = rng.choice(["allocate", "free", "touch", "register", "revive"] if tables
                        else ["allocate", "revive"])
        n = rng.randrange(1, 12)
        freed = [b for b in range(64) if not pools[1].ref_cnt[b]]
        revived = rng.sample(freed, min(n, len(freed)))  # free blocks a prompt hits
        table = tables[rng.randrange(len(tables))] if tables else []
        keys = [rng.randrange(0, next_key + n) for _ in table]  # some keys taken already
        next_key += n
        for bulk, pool in pools.items():
            for name in ("_BULK_MIN", "_SOLE_BULK_MIN"):
                monkeypatch.setattr(block_pool, name, bulk if name == bulk_name else 1 << 30)
            monkeypatch.setattr(residency_module, "_BULK_MIN", bulk)
            pool.residency.now = float(step)
            if op == "allocate":
                got = pool.allocate(n)
            elif op == "free":  # the last table taken (or touched), tail first
                pool.free(list(reversed(tables[-1])))
            elif op == "touch":  # a fork's or a prefix hit's second reference
                pool.touch_many(tables[-1])
            elif op == "revive":
                pool.touch_many(revived)
            else:
                pool.register_many(table, keys)
        if op == "allocate" and got is not None:
            tables.append(got)
        elif op == "free":
            tables.pop()
        elif op == "touch":
            tables.append(list(tables[-1]))
        elif op == "revive" and revived:
            tables.append(revived)
        assert _pool_state(pools[1]) == _pool_state(pools[1 << 30])


@pytest.mark.parametrize("seed", range(4))
def test_allocate_keyed_leaves_the_pool_as_allocate_then_register_many(seed):
    """``allocate_keyed(n, keys)`` (an admission's one pass per block) and ``allocate(n)``
    followed by ``register_many`` of its first ``len(keys)`` blocks, on the same random calls:
    the same blocks and the same pool, residency samples included. The keys are new, or
    some already held (by blocks in use, free, or in the popped window), or repeated."""
    rng = random.Random(seed)
    num_blocks = 48
    pools = []
    for _ in range(2):
        pool = BlockPool(num_blocks)
        pool.residency = ResidencyLog(num_blocks)
        pools.append(pool)
    tables: list[list[int]] = []
    next_key = 0
    for step in range(400):
        op = rng.choices(["admit", "free", "revive"], [6, 5, 1])[0] if tables else "admit"
        n = rng.randrange(0, 14)
        m = rng.randrange(0, n + 1)
        kind = rng.random()
        if kind < 0.6:  # new keys
            keys = list(range(next_key, next_key + m))
        elif kind < 0.9:  # some of them may be registered already
            keys = [rng.randrange(max(0, next_key - 40), next_key + m) for _ in range(m)]
        else:  # repeated within the call
            keys = [next_key + rng.randrange(0, max(1, m // 2)) for _ in range(m)]
        next_key += m
        freed = [b for b in range(num_blocks) if not pools[0].ref_cnt[b]]
        revived = rng.sample(freed, min(rng.randrange(1, 4), len(freed)))  # tombstones
        outs = []
        for i, pool in enumerate(pools):
            pool.residency.now = float(step)
            if op == "admit":
                if i == 0:
                    outs.append(pool.allocate_keyed(n, keys))
                else:
                    out = pool.allocate(n)
                    if out is not None:
                        pool.register_many(out[:m], keys)
                    outs.append(out)
            elif op == "free":
                pool.free(list(reversed(tables[-1])))
            else:
                pool.touch_many(revived)
        if op == "admit":
            assert outs[0] == outs[1]
            if outs[0] is not None:
                tables.append(outs[0])
        elif op == "free":
            tables.pop()
        elif revived:
            tables.append(revived)
        assert _pool_state(pools[0]) == _pool_state(pools[1])
        assert pools[0]._evicted == pools[1]._evicted
