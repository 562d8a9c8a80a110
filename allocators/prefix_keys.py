"""Prefix-cache keys: the chained key of every full block of a token stream.

A full block's cache key is ``(parent_chain_hash, token_bytes)``. The chain hash of
blocks ``0..j`` is ``H_j = H_{j-1} * MUL + hash(token_bytes_j)`` mod 2**64 (``H_{-1} =
0``, the first block's parent): a polynomial in ``MUL``, so a whole prompt's chain is
computed at once with numpy (``chain_arrays``); short runs are chained in Python
(``chain_keys`` picks). ``PromptKeys`` holds a prompt's chain, computed once and
reused while it waits, is admitted and is prefilled chunk by chunk.

NOTE: ``hash()`` of bytes is salted per process (PYTHONHASHSEED), but hits and block
ids do not depend on hash values (the dict compares the token bytes of a key too), so
runs stay deterministic.
"""

from __future__ import annotations

from array import array
from typing import Sequence

import numpy as np

assert array("i").itemsize == 4, "token buffers assume a 4-byte C int (np.int32 bytes)"

MASK = (1 << 64) - 1
MUL = 0x9E3779B97F4A7C15  # odd, so invertible mod 2**64
VECTOR_MIN_BLOCKS = 96  # from this many blocks on, chains are computed with numpy


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


def next_parent(key: tuple) -> int:
    """The chain hash a block's key passes on to the next block's key."""
    return (key[0] * MUL + hash(key[1])) & MASK


def chain_keys(parent: int, data: bytes, offset: int, count: int, width: int) -> list[tuple]:
    """The keys of the ``count`` blocks of ``width`` bytes in ``data`` from byte ``offset``,
    chained after ``parent`` (the previous block's ``next_parent``, 0 for block 0)."""
    if count >= VECTOR_MIN_BLOCKS:
        return list(zip(*chain_arrays(parent, data, offset, count, width)))
    keys = []
    for start in range(offset, offset + count * width, width):
        block = data[start:start + width]
        keys.append((parent, block))
        parent = (parent * MUL + hash(block)) & MASK
    return keys


def chain_arrays(parent: int, data: bytes, offset: int, count: int,
                 width: int) -> tuple[list[int], list[bytes]]:
    """``chain_keys`` computed with numpy, as two lists: the keys' parent chain hashes
    and their token bytes (no tuple per block: see ``PromptKeys``)."""
    blocks = np.frombuffer(data, dtype=f"V{width}", count=count, offset=offset).tolist()
    content = np.fromiter(map(hash, blocks), dtype=np.int64, count=count).view(np.uint64)
    up, down = _POWERS.get(count)
    # NOTE: H_j = MUL**j * (parent * MUL + sum_{i<=j} c_i * MUL**-i); uint64 wraps mod 2**64
    chain = (np.cumsum(content * down) + np.uint64(parent * MUL & MASK)) * up
    parents = [parent]
    parents += chain[:-1].tolist()
    return parents, blocks


def extend_tokens(buffer: array, token_ids: Sequence[int] | np.ndarray) -> None:
    """Append the ids to an ``array("i")`` buffer (a sequence's tail) in one C-level pass."""
    if isinstance(token_ids, np.ndarray):
        buffer.frombytes(token_ids.astype(np.int32, copy=False).tobytes())
    else:
        buffer.extend(token_ids)  # NOTE: a range or list, without an intermediate array


def token_bytes(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """The ids as packed 4-byte ints (the bytes cache keys hold); one C-level copy."""
    if isinstance(token_ids, np.ndarray):
        return token_ids.astype(np.int32, copy=False).tobytes()
    if isinstance(token_ids, array) and token_ids.typecode == "i":
        return token_ids.tobytes()
    return array("i", token_ids).tobytes()


class PromptKeys:
    """Token bytes passed to ``admit`` and the cache keys of all their full blocks.

    NOTE: a long prompt keeps its chain as two lists (``chain_arrays``) and builds key
    tuples only for the blocks asked for: a tuple per block of every long prompt costs
    more (allocation, garbage collection) than the few that are looked up or kept.
    ``hits``/``hit_keys``/``evictions`` memoise the last answer of the manager's ``_prefix_hits`` for
    them: the hit blocks, the keys they hold and the pool's ``num_evictions`` then.
    """

    __slots__ = ("data", "num_blocks", "_keys", "_parents", "_blocks", "hits", "hit_keys",
                 "evictions")

    def __init__(self, data: bytes, width: int) -> None:
        self.data = data
        self.num_blocks = n = len(data) // width
        self._keys: list[tuple] | None = None
        if n < VECTOR_MIN_BLOCKS:
            self._keys = chain_keys(0, data, 0, n, width)
        else:
            self._parents, self._blocks = chain_arrays(0, data, 0, n, width)
        self.hits: list[int] = []
        self.hit_keys: list[tuple] = []
        self.evictions = -1  # not asked yet

    def keys(self, start: int, end: int) -> list[tuple]:
        """The keys of full blocks ``start .. end - 1``."""
        if self._keys is not None:
            return self._keys[start:end]
        return list(zip(self._parents[start:end], self._blocks[start:end]))
