"""KV manager bookkeeping: block pool, prefix lookup, paged append, arena placement.

Each benchmark states what one call does; divide by the ops per call for a per-op cost.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from _setup import unique_prompt
from pagebench.allocators.arena import make_arena
from pagebench.allocators.block_pool import BlockPool
from pagebench.allocators.paged import PagedKVCacheManager

BATCH = 256


def bench_block_pool_allocate_free(benchmark):
    """One call: 1,000 requests allocate 8 blocks each and free them tail first."""
    pool = BlockPool(65536)

    def cycle():
        for _ in range(1000):
            pool.free(reversed(pool.allocate(8)))

    benchmark(cycle)
    assert pool.num_free == 65536
    benchmark.extra_info["ops_per_call"] = 2000


def bench_prefix_lookup_hits(benchmark):
    """One call: admit (64 cached 16-token blocks = a 1,024-token shared prefix + 40 new
    tokens) and free, 100 times: lookups of 64-bit chained block hashes."""
    rng = np.random.default_rng(0)
    prefix = unique_prompt(rng, 1024)
    manager = PagedKVCacheManager(8192, 16, enable_prefix_caching=True)
    assert manager.admit(0, prefix, 1100, 1024) is not None  # registers the prefix blocks
    prompts = [np.concatenate([prefix, unique_prompt(rng, 40)]) for _ in range(100)]

    def cycle():
        for i, prompt in enumerate(prompts, start=1):
            admission = manager.admit(i, prompt, len(prompt) + 16, len(prompt))
            manager.free(i)
        return admission

    admission = benchmark(cycle)
    assert admission.num_cached_tokens >= 1024  # + its own earlier rounds' full blocks
    benchmark.extra_info["ops_per_call"] = 200


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["nocache", "prefix_cache"])
def bench_paged_append_batch_256(benchmark, prefix_caching):
    """One call: 16 decode steps of 256 sequences (one token each; every sequence crosses
    one block boundary), in a fresh manager with 256 admitted 100-token prompts."""
    rng = np.random.default_rng(0)
    prompts = [unique_prompt(rng, 100) for _ in range(BATCH)]
    tokens = [[int(t)] for t in rng.integers(0, 1 << 29, 16)]

    def setup():
        manager = PagedKVCacheManager(BATCH * 16, 16, enable_prefix_caching=prefix_caching)
        for i, prompt in enumerate(prompts):
            assert manager.admit(i, prompt, 100 + 64, 100) is not None
        return (manager,), {}

    def steps(manager):
        append = manager.append
        for token in tokens:
            for seq_id in range(BATCH):
                append(seq_id, token)
        return manager

    manager = benchmark.pedantic(steps, setup=setup, rounds=50, warmup_rounds=2)
    assert manager.num_tokens(BATCH - 1) == 116
    benchmark.extra_info["ops_per_call"] = 16 * BATCH


@pytest.mark.parametrize("arena", ["buddy", "first_fit", "best_fit"])
def bench_contiguous_arena_placement(benchmark, arena):
    """One call: 1,000 x (place a 100..4,096-slot extent, free a random live one) in a
    60K-slot arena kept about 70% full: placement, splitting and coalescing under churn."""
    capacity = 60_000
    rng = random.Random(0)
    sizes = [rng.randint(100, 4096) for _ in range(1000)]
    victims = [rng.random() for _ in range(1000)]

    def setup():
        a = make_arena(arena, capacity)
        live = []
        while a.free_slots > 0.3 * capacity:
            start = a.allocate(rng.randint(100, 4096))
            if start is None:
                break
            live.append(start)
        return (a, live), {}

    def churn(a, live):
        for size, victim in zip(sizes, victims):
            start = a.allocate(size)
            if start is not None:
                live.append(start)
            a.free(live.pop(int(victim * len(live))))
        return a

    benchmark.pedantic(churn, setup=setup, rounds=30, warmup_rounds=2)
    benchmark.extra_info["ops_per_call"] = 2000
