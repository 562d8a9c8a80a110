"""Physical KV blocks: reference counts, an LRU free queue and the prefix-cache map.

Modelled on vLLM v1 (``vllm/v1/core/block_pool.py``, ``FreeKVCacheBlockQueue``):

- The free queue is an intrusive doubly linked list over block ids, kept in two
  int lists (``_prev``/``_next``) with a fake head and a fake tail node, so that
  popping the head, appending at the tail and removing any block are all O(1).
  Initially it holds blocks ``0, 1, ..., num_blocks - 1`` in that order.
- Allocation pops from the head: the least recently freed block is reused first.
- A full block whose content is known is *registered* under its cache key
  ``(parent_chain_hash, token_bytes)``. It keeps that key while it is allocated and
  after it is freed (ref count 0, back in the free queue), so a later request can
  still hit it; the key is dropped only when the block is popped for reuse. So
  cached blocks are evicted least recently freed first.
- Callers free a request's blocks tail first (``reversed(block_table)``), so the
  tail of a request, the part least likely to be shared, is evicted first.

NOTE: the key holds the block's token bytes and its parent's chain hash; the dict
compares them on every hit, which is the token-id check against hash collisions.
"""

from __future__ import annotations

from typing import Iterable


class BlockPool:
    """``num_blocks`` device blocks with ref counts, a free queue and a hash map."""

    __slots__ = (
        "num_blocks", "num_free", "num_cached_free", "num_evictions", "ref_cnt", "_keys", "_cached",
        "_prev", "_next", "_head", "_tail",
    )

    def __init__(self, num_blocks: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}: "
                             "give the pool at least one block")
        n = num_blocks
        self.num_blocks = n
        self.num_free = n
        self.num_cached_free = 0  # free blocks that still hold a registered key
        self.num_evictions = 0  # keys dropped so far (a block popped for reuse): only this ends a hit
        self.ref_cnt: list[int] = [0] * n
        self._keys: list[tuple | None] = [None] * n  # cache key of a registered block
        self._cached: dict[tuple, int] = {}  # cache key -> block id
        # Linked list over ids 0..n-1 plus fake head (n) and fake tail (n + 1).
        self._head = n
        self._tail = n + 1
        # NOTE: _next[head] is the first free block, _prev[tail] the last; an empty
        # queue links head and tail directly.
        self._next: list[int] = list(range(1, n + 2)) + [n + 1]
        self._next[n - 1] = n + 1
        self._next[n] = 0
        self._prev: list[int] = [n] + list(range(0, n - 1)) + [n, n - 1]

    # ------------------------------------------------------------------ queue
    def _remove(self, b: int) -> None:
        nxt, prv = self._next, self._prev
        p, q = prv[b], nxt[b]
        nxt[p] = q
        prv[q] = p

    def _append(self, b: int) -> None:
        nxt, prv, t = self._next, self._prev, self._tail
        p = prv[t]
        nxt[p] = b
        prv[b] = p
        nxt[b] = t
        prv[t] = b

    def free_queue(self) -> list[int]:
        """The free queue from head (next to be reused) to tail. O(num_free); for tests."""
        out, nxt, b = [], self._next, self._next[self._head]
        while b != self._tail:
            out.append(b)
            b = nxt[b]
        return out

    def cached_flags_at_head(self, n: int) -> list[bool]:
        """Whether each of the next ``n`` blocks to be allocated still holds a cache key. O(n)."""
        out, nxt, keys, b = [], self._next, self._keys, self._next[self._head]
        for _ in range(min(n, self.num_free)):
            out.append(keys[b] is not None)
            b = nxt[b]
        return out

    # ------------------------------------------------------------- allocation
    def allocate(self, n: int) -> list[int] | None:
        """Pop ``n`` blocks from the head of the free queue (ref count 1 each).

        A popped block that still holds a cache key is evicted from the cache.
        Returns None, changing nothing, when fewer than ``n`` blocks are free.
        """
        if n > self.num_free:
            return None
        self.num_free -= n
        nxt, prv, head = self._next, self._prev, self._head
        keys, ref = self._keys, self.ref_cnt
        out = []
        b = nxt[head]
        if self.num_cached_free == 0:  # NOTE: no free block holds a key: nothing to evict
            for _ in range(n):
                out.append(b)
                ref[b] = 1
                b = nxt[b]
        else:
            for _ in range(n):
                out.append(b)
                ref[b] = 1
                key = keys[b]
                if key is not None:  # NOTE: a registered block is its key's block
                    keys[b] = None
                    self.num_cached_free -= 1
                    self.num_evictions += 1
                    del self._cached[key]
                b = nxt[b]
        nxt[head] = b
        prv[b] = head
        return out

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block; blocks reaching 0 join the queue tail in order.

        NOTE: pass a request's blocks tail first (``reversed(table)``) so its tail is
        evicted first.
        """
        ref, keys, nxt, prv, tail = self.ref_cnt, self._keys, self._next, self._prev, self._tail
        freed = cached = 0
        last = prv[tail]
        for b in blocks:
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                nxt[last] = b  # append b at the tail (the queue is relinked once below)
                prv[b] = last
                last = b
                freed += 1
                if keys[b] is not None:
                    cached += 1
            elif r < 0:  # pragma: no cover - internal invariant
                ref[b] = 0
                nxt[last], prv[tail] = tail, last
                self.num_free += freed
                self.num_cached_free += cached
                raise RuntimeError(f"block {b} freed more often than allocated")
        nxt[last] = tail
        prv[tail] = last
        self.num_free += freed
        self.num_cached_free += cached

    def touch(self, b: int) -> None:
        """Take one more reference to block ``b`` (a prefix-cache hit or a fork).

        A free cached block is pulled out of the free queue in O(1).
        """
        r = self.ref_cnt[b]
        if r == 0:
            self._remove(b)
            self.num_free -= 1
            if self._keys[b] is not None:
                self.num_cached_free -= 1
        self.ref_cnt[b] = r + 1

    # ----------------------------------------------------------- prefix cache
    def lookup(self, key: tuple) -> int | None:
        """The block registered under ``key`` (allocated or free-but-cached), or None."""
        return self._cached.get(key)

    def register(self, b: int, key: tuple) -> bool:
        """Register allocated full block ``b`` under ``key``; False if the key is taken.

        NOTE: when another block already holds the same content, ``b`` stays
        unregistered (one block per key, as in nano-vllm).
        """
        if key in self._cached or self._keys[b] is not None:
            return False
        self._cached[key] = b
        self._keys[b] = key
        return True

    def key_of(self, b: int) -> tuple | None:
        return self._keys[b]

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (allocated or free)."""
        return len(self._cached)
