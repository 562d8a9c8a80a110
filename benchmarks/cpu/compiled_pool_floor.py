"""What compiled code would save on the block pool's per-block work (an estimate, not a pool).

Mooncake-like churn: each request takes 768 blocks in chunks of 64 from the head of the
free queue (evicting the key each popped block still holds), registers a new key for
each, and is freed (tail first) once 40 newer requests are live, in a 60,000-block pool.
The same churn runs through pagebench's ``BlockPool`` and through a numba kernel over
flat int64 arrays with an open-addressing key table, block lists crossing to and from
Python lists as the manager keeps them. Prints seconds per block for both, medians of
``--rounds``, side by side in one process.

The kernel is the least a compiled pool must do: no tombstones in the queue (nothing is
touched), no table resizing or clean-up of deleted slots. It needs numba, which
pagebench does not depend on:

    pip install numba && python benchmarks/cpu/compiled_pool_floor.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pagebench.allocators.block_pool import BlockPool  # noqa: E402

try:
    from numba import njit
except ImportError:  # pragma: no cover - an optional tool
    sys.exit("this estimate needs numba (not a pagebench dependency): pip install numba")

NUM_BLOCKS, BLOCKS_PER_REQUEST, CHUNK, LIVE, REQUESTS = 60_000, 768, 64, 40, 400
TABLE_SLOTS = 1 << 18  # open addressing, key 0 = empty, -1 = deleted
MIX = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15 as int64


@njit(cache=True)
def _slot(table_keys, key):
    """The slot holding ``key``, or the first free one (empty or deleted) on its probe path."""
    mask = table_keys.shape[0] - 1
    i = ((key * MIX) >> np.int64(40)) & mask
    free = -1
    while True:
        k = table_keys[i]
        if k == key:
            return i
        if k == 0:
            return free if free >= 0 else i
        if k == -1 and free < 0:
            free = i
        i = (i + 1) & mask


@njit(cache=True)
def _allocate(queue, ends, ref_cnt, block_key, table_keys, n, out):
    """Pop ``n`` blocks into ``out`` (ref count 1), evicting the key each still holds."""
    head = ends[0]
    for j in range(n):
        b = queue[head % queue.shape[0]]
        head += 1
        ref_cnt[b] = 1
        if block_key[b] != 0:
            table_keys[_slot(table_keys, block_key[b])] = -1
            block_key[b] = 0
        out[j] = b
    ends[0] = head


@njit(cache=True)
def _register(blocks, keys, block_key, table_keys, table_blocks):
    """Register each block under its key unless the key is taken."""
    for j in range(blocks.shape[0]):
        i = _slot(table_keys, keys[j])
        if table_keys[i] != keys[j]:
            table_keys[i] = keys[j]
            table_blocks[i] = blocks[j]
            block_key[blocks[j]] = keys[j]


@njit(cache=True)
def _free(blocks, queue, ends, ref_cnt):
    """Drop a reference to each block; blocks reaching 0 join the queue's tail in order."""
    tail = ends[1]
    for j in range(blocks.shape[0]):
        b = blocks[j]
        ref_cnt[b] -= 1
        if ref_cnt[b] == 0:
            queue[tail % queue.shape[0]] = b
            tail += 1
    ends[1] = tail


def churn_python(keys: np.ndarray, requests: int) -> float:
    pool, live = BlockPool(NUM_BLOCKS), []
    start = time.perf_counter()
    for r in range(requests):
        request_keys, table = keys[r].tolist(), []
        for c in range(0, BLOCKS_PER_REQUEST, CHUNK):
            got = pool.allocate(CHUNK)
            pool.register_many(got, request_keys[c:c + CHUNK])
            table += got
        live.append(table)
        if len(live) > LIVE:
            pool.free(live.pop(0)[::-1])
    return time.perf_counter() - start


def churn_compiled(keys: np.ndarray, requests: int) -> float:
    queue = np.arange(NUM_BLOCKS, dtype=np.int64)  # [NUM_BLOCKS] ring
    ends = np.array([0, NUM_BLOCKS], dtype=np.int64)  # head, tail tickets
    ref_cnt = np.zeros(NUM_BLOCKS, np.int64)
    block_key = np.zeros(NUM_BLOCKS, np.int64)  # 0 = no key
    table_keys = np.zeros(TABLE_SLOTS, np.int64)
    table_blocks = np.zeros(TABLE_SLOTS, np.int64)
    live = []
    start = time.perf_counter()
    for r in range(requests):
        table = []
        for c in range(0, BLOCKS_PER_REQUEST, CHUNK):
            out = np.empty(CHUNK, np.int64)
            _allocate(queue, ends, ref_cnt, block_key, table_keys, CHUNK, out)
            _register(out, keys[r, c:c + CHUNK], block_key, table_keys, table_blocks)
            table += out.tolist()  # the manager keeps block tables as Python lists
        live.append(table)
        if len(live) > LIVE:
            _free(np.array(live.pop(0)[::-1], dtype=np.int64), queue, ends, ref_cnt)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    keys = np.random.default_rng(0).integers(1, 2**63 - 1, (REQUESTS, BLOCKS_PER_REQUEST),
                                             dtype=np.int64)  # [REQUESTS, BLOCKS_PER_REQUEST]
    churn_compiled(keys, 2)  # compile (or load numba's cache) first
    blocks = REQUESTS * BLOCKS_PER_REQUEST
    python, compiled = [], []
    for _ in range(args.rounds):  # alternating, one process
        python.append(churn_python(keys, REQUESTS) / blocks * 1e6)
        compiled.append(churn_compiled(keys, REQUESTS) / blocks * 1e6)
    ratios = [p / c for p, c in zip(python, compiled)]
    print(json.dumps({"blocks_per_round": blocks, "rounds": args.rounds,
                      "python_us_per_block": round(statistics.median(python), 3),
                      "compiled_us_per_block": round(statistics.median(compiled), 3),
                      "ratio_median": round(statistics.median(ratios), 2),
                      "ratios": [round(x, 2) for x in ratios]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
