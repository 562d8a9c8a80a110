"""The block pool's and the key chain's fast paths against their general paths.

- ``BlockPool.free`` of a list whose blocks all hold their last reference stores each
  block's ref count and queue ticket without a branch (``_free_sole``); any other
  iterable goes through the general loop. Both must leave the same pool (queue, tickets,
  cached counts, residency samples).
- ``chain_keys`` hashes a chain three ways by its length (slices, a numpy split, numpy
  arithmetic): the same keys whichever way, from any parent.
"""

import random

import numpy as np
import pytest

from pagebench.allocators import prefix_keys
from pagebench.allocators.block_pool import BlockPool
from pagebench.allocators.residency import ResidencyLog


def _state(pool: BlockPool) -> tuple:
    log = pool.residency
    return (pool.free_queue(), list(pool.ref_cnt), list(pool._pos), list(pool._keys),
            bytes(pool._held), dict(pool._cached), pool.num_free, pool.num_cached_free,
            pool.num_evictions, list(log.lifetimes), list(log.idle_before_evict),
            list(log.reuse_gaps), list(log._since))


@pytest.mark.parametrize("seed", range(4))
def test_a_free_of_sole_owned_blocks_leaves_the_pool_as_the_general_loop(seed):
    """The same random allocations, shares, registrations and frees on two pools: one
    frees lists (the fast path where it applies), the other iterators (never)."""
    rng = random.Random(seed)
    pools = []
    for _ in range(2):
        pool = BlockPool(48)
        pool.residency = ResidencyLog(48)
        pools.append(pool)
    tables: list[list[int]] = []  # each holds one reference to its blocks
    next_key = 0
    sole_frees = 0
    for step in range(400):
        op = rng.choice(["allocate", "free", "free", "share", "register"] if tables
                        else ["allocate"])
        n = rng.randrange(1, 9)
        table = tables[rng.randrange(len(tables))] if tables else []
        keys = list(range(next_key, next_key + len(table)))
        next_key += len(table)
        if op == "free":
            gone = tables.pop(rng.randrange(len(tables)))
            sole_frees += len(gone) > 1 and all(pools[0].ref_cnt[b] == 1 for b in gone)
        got = []
        for fast, pool in zip((True, False), pools):
            pool.residency.now = float(step)
            if op == "allocate":
                got.append(pool.allocate(n))
            elif op == "free":  # tail first, as a sequence's table
                blocks = gone[::-1]
                pool.free(blocks if fast else iter(blocks))
            elif op == "share":  # a fork: a second reference to every block
                pool.touch_many(table)
            else:
                pool.register_many(table, keys)
        if op == "allocate" and got[0] is not None:
            assert got[0] == got[1]
            tables.append(got[0])
        elif op == "share":
            tables.append(list(table))
        assert _state(pools[0]) == _state(pools[1])
    assert sole_frees > 20  # the fast path was taken


def _keys(parent: int, data: bytes, count: int, width: int, path: str) -> list[int]:
    """``chain_keys`` forced onto one of its paths."""
    vector, split = prefix_keys.VECTOR_MIN_BLOCKS, prefix_keys.SPLIT_MIN_BLOCKS
    prefix_keys.VECTOR_MIN_BLOCKS = 1 if path == "numpy" else 10**9
    prefix_keys.SPLIT_MIN_BLOCKS = 1 if path == "split" else 10**9
    try:
        return prefix_keys.chain_keys(parent, data, 0, count, width)
    finally:
        prefix_keys.VECTOR_MIN_BLOCKS, prefix_keys.SPLIT_MIN_BLOCKS = vector, split


@pytest.mark.parametrize("count", [1, 2, 15, 16, 17, 50, 95, 96, 130])
@pytest.mark.parametrize("parent", [0, 7, (1 << 64) - 1])
def test_the_three_chain_paths_give_the_same_keys(count, parent):
    width = 64
    data = np.random.default_rng(count).integers(0, 1 << 30, count * width // 4,
                                                 dtype=np.int32).tobytes()
    slices = _keys(parent, data, count, width, "slices")
    assert _keys(parent, data, count, width, "split") == slices
    assert _keys(parent, data, count, width, "numpy") == slices
    assert prefix_keys.chain_keys(parent, data, 0, count, width) == slices  # as chosen
