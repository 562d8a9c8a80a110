"""Prefix-cache keys: the chain hash of every full block of a token stream.

A full block's cache key is the 64-bit chain hash of its tokens and of every block
before it: ``H_j = H_{j-1} * MUL + hash(token_bytes_j)`` mod 2**64, ``H_{-1} = 0``
(vLLM's ``BlockHash`` likewise hashes the parent's hash with the block's tokens). It
is a polynomial in ``MUL``, so a whole prompt's chain is computed at once with numpy
(``chain_arrays``); short runs are chained in Python (``chain_keys`` picks).
``PromptKeys`` holds a prompt's chain, computed once and reused while it waits, is
admitted and is prefilled chunk by chunk.

NOTE: two different token prefixes get one key only by a 64-bit collision: each
block contributes ``hash()`` of its bytes (SipHash, keyed per process), so
``n`` distinct keys collide with probability about ``n**2 / 2**65`` (below 1e-5 for
the 10M keys of the Mooncake trace). A key used to be the pair (parent chain hash,
block bytes), whose byte check covered the last block only: the prefix before it
was already trusted to the same 64-bit hash. Hits and block ids do not depend on the
hash values (only on which keys are equal), so runs stay deterministic although
``hash()`` is salted per process (PYTHONHASHSEED).
"""

from __future__ import annotations

import sys
from array import array
from typing import Sequence

import numpy as np

assert array("i").itemsize == 4, "token buffers assume a 4-byte C int (np.int32 bytes)"

MASK = (1 << 64) - 1
MUL = 0x9E3779B97F4A7C15  # odd, so invertible mod 2**64
VECTOR_MIN_BLOCKS = 96  # from this many blocks on, chains are computed with numpy
# From this many blocks on, numpy splits the bytes into blocks (measured: on the replay of
# the Azure conv paged manager's calls, 2026-12-04, -4% instructions against slicing)
SPLIT_MIN_BLOCKS = 16


class _Powers:
    """``MUL ** i`` and ``MUL ** -i`` mod 2**64 for i < n as uint64 arrays, grown on demand."""

    def __init__(self) -> None:
        self.up = np.ones(1, dtype=np.uint64)
        self.down = np.ones(1, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        while len(self.up) < n:  # doubling: [x] -> [x, x * MUL**len]
            k = len(self.up)
            self.up = np.concatenate([self.up, self.up * np.uint64(pow(MUL, k, 1 << 64))])
            self.down = np.concatenate([self.down, self.down * np.uint64(pow(MUL, -k, 1 << 64))])
        return self.up[:n], self.down[:n]


_POWERS = _Powers()


def chain_keys(parent: int, data: bytes, offset: int, count: int, width: int) -> list[int]:
    """The keys of the ``count`` blocks of ``width`` bytes in ``data`` from byte ``offset``,
    chained after ``parent`` (the previous block's key, 0 for block 0)."""
    if count >= VECTOR_MIN_BLOCKS:
        return chain_arrays(parent, data, offset, count, width)
    keys = []
    if count >= SPLIT_MIN_BLOCKS:  # numpy cuts the blocks' bytes apart (in C)
        blocks = np.frombuffer(data, dtype=f"V{width}", count=count, offset=offset).tolist()
        for content in map(hash, blocks):
            parent = (parent * MUL + content) & MASK
            keys.append(parent)
        return keys
    for start in range(offset, offset + count * width, width):
        parent = (parent * MUL + hash(data[start:start + width])) & MASK
        keys.append(parent)
    return keys


def chain_arrays(parent: int, data: bytes, offset: int, count: int, width: int) -> list[int]:
    """``chain_keys`` computed with numpy."""
    blocks = np.frombuffer(data, dtype=f"V{width}", count=count, offset=offset).tolist()
    content = np.fromiter(map(hash, blocks), dtype=np.int64, count=count).view(np.uint64)
    up, down = _POWERS.get(count)
    # NOTE: H_j = MUL**j * (parent * MUL + sum_{i<=j} c_i * MUL**-i); uint64 wraps mod 2**64
    chain = (np.cumsum(content * down) + np.uint64(parent * MUL & MASK)) * up
    return chain.tolist()


# The ids an ``array("i")`` holds: [_INT32_MIN, _INT32_END)
_INT32_MIN, _INT32_END = -(1 << 31), 1 << 31


def extend_tokens(buffer: array, token_ids: Sequence[int] | np.ndarray) -> None:
    """Append the ids to an ``array("i")`` buffer (a sequence's tail) in one C-level pass."""
    if isinstance(token_ids, np.ndarray):
        buffer.frombytes(token_ids.astype(np.int32, copy=False).tobytes())
    elif (type(token_ids) is range and token_ids.step == 1
          and _INT32_MIN <= token_ids.start and token_ids.stop <= _INT32_END):
        # NOTE: a range (consecutive synthetic ids) laid out by numpy:
        # ``extend`` converts it id by id, ~4x the time for a 32-id block; the bounds keep
        # numpy from wrapping ids that ``extend`` refuses
        buffer.frombytes(np.arange(token_ids.start, token_ids.stop, dtype=np.int32).tobytes())
    else:
        buffer.extend(token_ids)  # NOTE: a range or list, without an intermediate array


# run_bytes packs up to this many ids as an integer, memoising each count's lanes (timed
# 2026-12-05, ns for 16 / 48 / 64 ids: integer 200 / 386 / 451, numpy 385 / 398 / 387)
_RUN_INT_MAX = 48
_RUN_LANES: dict[int, tuple[int, int]] = {}  # count -> (sum 2**(32 i), sum i * 2**(32 i))


def run_bytes(first: int, count: int) -> bytes:
    """``token_bytes(range(first, first + count))``, for ids in ``[0, 2**31)``.

    NOTE: for a few blocks' ids (one read per block filled) one integer multiply-add
    instead of numpy: the ``count`` ids packed as 4-byte ints are the integer whose
    32-bit lanes (from the lowest) hold ``first + i``, i.e. ``first * sum(2**(32 i)) +
    sum(i * 2**(32 i))``; no lane carries into the next, as every id fits in 31 bits.
    """
    lanes = _RUN_LANES.get(count)
    if lanes is None:
        if count > _RUN_INT_MAX:
            return np.arange(first, first + count, dtype=np.int32).tobytes()
        lanes = _RUN_LANES[count] = (sum(1 << 32 * i for i in range(count)),
                                     sum(i << 32 * i for i in range(count)))
    return (first * lanes[0] + lanes[1]).to_bytes(4 * count, sys.byteorder)


def token_bytes(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """The ids as packed 4-byte ints (the bytes cache keys hold); one C-level copy."""
    if isinstance(token_ids, np.ndarray):
        return token_ids.astype(np.int32, copy=False).tobytes()
    if isinstance(token_ids, array) and token_ids.typecode == "i":
        return token_ids.tobytes()
    return array("i", token_ids).tobytes()


class PromptKeys:
    """Token bytes passed to ``admit`` and the cache keys of all their full blocks.

    ``hits``/``evictions`` memoise the last answer of the manager's ``_prefix_hits``
    for them: the hit blocks and the pool's ``num_evictions`` then.
    """

    __slots__ = ("data", "num_blocks", "_keys", "hits", "evictions")

    def __init__(self, data: bytes, width: int) -> None:
        self.data = data
        self.num_blocks = n = len(data) // width
        self._keys = chain_keys(0, data, 0, n, width)
        self.hits: list[int] = []
        self.evictions = -1  # not asked yet

    def keys(self, start: int, end: int) -> list[int]:
        """The keys of full blocks ``start .. end - 1``."""
        return self._keys[start:end]
