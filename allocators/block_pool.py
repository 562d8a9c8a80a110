"""Physical KV blocks: reference counts, an LRU free queue and the prefix-cache map.

Modelled on vLLM v1 (``vllm/v1/core/block_pool.py``, ``FreeKVCacheBlockQueue``):

- The free queue is FIFO over block ids. Initially it holds blocks ``0, 1, ...,
  num_blocks - 1`` in that order.
- Allocation pops from the head: the least recently freed block is reused first.
- A full block whose content is known is *registered* under its cache key (the
  chain hash of ``pagebench.allocators.prefix_keys``). It keeps that key while it is allocated and
  after it is freed (ref count 0, back in the free queue), so a later request can
  still hit it; the key is dropped only when the block is popped for reuse. So
  cached blocks are evicted least recently freed first. With an offload tier
  (``on_evict``, ``pagebench.allocators.offload_tier``) an evicted key moves there instead.
- Callers free a request's blocks tail first (``reversed(block_table)``), so the
  tail of a request, the part least likely to be shared, is evicted first.

The queue is a Python list read from a head index, so that every operation works
on many blocks at once with list slices and C-level scans (a request holds
hundreds of blocks). Ref counts, queue tickets and key flags are flat buffers
(``array``/``bytearray``) with numpy views over the same memory: single blocks are
read and written through the buffers, and from ``_BULK_MIN`` blocks on, ``allocate``,
``free`` and ``touch_many`` gather and scatter through the views in a few numpy calls
(allocation still drops each evicted key from the cache map in a loop); so does a free
of a sequence's own blocks from ``_SOLE_BULK_MIN`` on. An admission's new blocks are
popped, evicted and registered in one pass (``allocate_keyed``). A block taken out of
the middle of the queue (``touch``) is
overwritten by a tombstone (``_DEAD``) that allocation skips; ``_pos`` gives each
free block's entry. NOTE: entry ``i`` of ``_q`` has ticket ``_base + i``; a free
block's ``_pos`` is the ticket of its (only live) entry, so tickets survive the
compactions that drop the consumed head.
"""

from __future__ import annotations

from array import array
from itertools import chain, islice, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

import numpy as np

if TYPE_CHECKING:
    from pagebench.allocators.residency import ResidencyLog

_DEAD = -1  # a queue entry whose block was taken out of the queue (by ``touch``)
_COMPACT_MIN = 4096  # drop the consumed head of the queue list once it is this long
# From this many blocks on, allocate/free/touch_many/register_many work on them at once
# (numpy).
# NOTE: below it a Python loop is faster (measured: the Azure conv replay's admissions
# and frees, ~60 blocks each, lost ~0.2 s to numpy's per-call cost at 32).
_BULK_MIN = 256
# From this many blocks on, ``free`` of blocks that all reach ref count 0 (``_free_sole``)
# sets their ref counts and tickets through the views. NOTE: measured on the Azure conv
# admissions' cycle (allocate ~55 blocks, register, free): -3 us a free of 55 blocks with
# the residency log, which reads the same index array.
_SOLE_BULK_MIN = 32


def gather(values: Sequence, index: Sequence[int]) -> tuple:
    """``tuple(values[i] for i in index)``, in C."""
    if len(index) > 1:
        return itemgetter(*index)(values)
    return (values[index[0]],) if index else ()


class BlockPool:
    """``num_blocks`` device blocks with ref counts, a free queue and a hash map."""

    __slots__ = (
        "num_blocks", "num_free", "num_cached_free", "num_evictions", "ref_cnt", "_keys", "_cached",
        "_held", "_q", "_head", "_base", "_pos", "_dead", "_evicted", "_evicted_base",
        "_ref_v", "_held_v", "_pos_v", "on_evict", "residency",
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
        self.ref_cnt = array("q", bytes(8 * n))  # [n] reference counts
        self._keys: list[int | None] = [None] * n  # cache key of a registered block
        self._cached: dict[int, int] = {}  # cache key -> block id
        # NOTE: _held[b] = 1 iff _keys[b] is not None: counting keyed blocks must not touch keys
        self._held = bytearray(n)
        self._q: list[int] = list(range(n))  # queue entries: block ids or _DEAD
        self._head = 0  # index in _q of the queue's first entry
        self._base = 0  # ticket of _q[0]
        self._pos = array("q", range(n))  # ticket of a free block's entry
        self._views()
        self._dead = 0  # _DEAD entries at or after _head
        self._evicted: list[int] = []  # the blocks of the last evictions (see evicted_since)
        self._evicted_base = 0  # evictions before _evicted[0]
        # Called with the keys of each allocation's evictions, in eviction order, before they
        # are dropped (an offload tier's ``store``); None: evicted keys are forgotten.
        self.on_evict: Callable[[list[int]], None] | None = None
        # Told of every block taken, released and revived, on the engine's clock
        # (``pagebench.allocators.residency``); None: nothing recorded.
        self.residency: ResidencyLog | None = None

    def _views(self) -> None:
        """[n] numpy views of the ref count, ticket and flag buffers (which therefore never
        change size)."""
        self._ref_v = np.frombuffer(self.ref_cnt, dtype=np.int64)
        self._held_v = np.frombuffer(self._held, dtype=np.uint8)
        self._pos_v = np.frombuffer(self._pos, dtype=np.int64)

    def __getstate__(self) -> dict:
        """For pickle and ``copy``: the state without the views (a view would be copied on
        its own, no longer sharing its buffer); ``__setstate__`` makes them again."""
        return {name: getattr(self, name) for name in self.__slots__ if not name.endswith("_v")}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self._views()

    # ------------------------------------------------------------------ queue
    def _live(self) -> Iterator[int]:
        """The free queue's blocks from head to tail (skipping tombstones), read in place.

        NOTE: reads ``_q`` by index from ``_head``, never a copy of it: asking for the
        first few blocks costs those entries (and tombstones among them), not the queue."""
        q = self._q
        return (b for b in map(q.__getitem__, range(self._head, len(q))) if b != _DEAD)

    def free_queue(self) -> list[int]:
        """The free queue from head (next to be reused) to tail. O(num_free); for tests."""
        return list(self._live())

    def cached_flags_at_head(self, n: int) -> list[bool]:
        """Whether each of the next ``n`` blocks to be allocated still holds a cache key.
        O(n + tombstones passed), whatever the pool's size."""
        keys = self._keys
        return [keys[b] is not None for b in islice(self._live(), min(n, self.num_free))]

    def next_blocks(self, n: int) -> list[int]:
        """The next ``n`` blocks ``allocate`` would pop (all free ones if fewer), head first.
        O(n + tombstones passed)."""
        return list(islice(self._live(), min(n, self.num_free)))

    def _compact(self) -> None:
        """Drop the consumed head of ``_q`` and, when tombstones outnumber the blocks, the
        tombstones too (renumbering every free block's entry); trim the eviction log.
        Amortised O(1) per entry."""
        q = self._q
        if self._dead > self.num_blocks:
            live = [b for b in q[self._head:] if b != _DEAD]
            self._q = live
            self._base += len(q)
            self._pos_v[live] = np.arange(self._base, self._base + len(live))
            self._dead = 0
        else:
            del q[:self._head]
            self._base += self._head
        self._head = 0
        log = self._evicted
        if len(log) > 2 * self.num_blocks:  # keep the newest half of the eviction log
            drop = len(log) // 2
            del log[:drop]
            self._evicted_base += drop

    # ------------------------------------------------------------- allocation
    def allocate(self, n: int) -> list[int] | None:
        """Pop ``n`` blocks from the head of the free queue (ref count 1 each).

        A popped block that still holds a cache key is evicted from the cache.
        Returns None, changing nothing, when fewer than ``n`` blocks are free.
        """
        if n > self.num_free:
            return None
        q, head = self._q, self._head
        end = head + n
        out = q[head:end]
        dead = out.count(_DEAD)
        if dead:  # widen the window past the tombstones, then drop them
            self._dead -= dead
            while dead:
                more = q[end:end + dead]
                end += dead
                dead = more.count(_DEAD)
                self._dead -= dead
                out += more
            out = [b for b in out if b != _DEAD]
        self._head = end
        self.num_free -= n
        ref = self.ref_cnt
        if self.residency is not None:  # before the keys of the evicted blocks are dropped
            self.residency.allocated(out, self._held)
        if n >= _BULK_MIN:
            self._take_many(out)
        elif self.num_cached_free:
            held, keys, cached, log = self._held, self._keys, self._cached, self._evicted
            if self.on_evict is not None:
                self.on_evict([keys[b] for b in out if held[b]])
            evicted = len(log)
            for b in out:
                ref[b] = 1
                if held[b]:  # NOTE: a registered block is its key's block
                    del cached[keys[b]]
                    keys[b] = None
                    held[b] = 0
                    log.append(b)
            evicted = len(log) - evicted
            self.num_cached_free -= evicted
            self.num_evictions += evicted
        else:
            for b in out:
                ref[b] = 1
        if end >= _COMPACT_MIN and 2 * end >= len(q):
            self._compact()
        return out

    def allocate_keyed(self, n: int, keys: Sequence[int]) -> list[int] | None:
        """``allocate(n)``, then ``register_many`` of its first ``len(keys)`` blocks (at
        most ``n``) under ``keys``, in one call: an admission's new blocks, the full ones
        keyed by its prompt's chain.

        NOTE: when no block holds any of ``keys`` (a prompt's keys past its hits, as a
        rule), registering each block as it is popped leaves the pool as registering them
        after the whole allocation does, so each block is evicted and registered in one
        pass. Otherwise (or with an offload tier, tombstones among the blocks popped, or many
        blocks) it is those two calls.
        """
        cached, q, head = self._cached, self._q, self._head
        end = head + n
        out = q[head:end]
        if (n >= _BULK_MIN or n > self.num_free or self.on_evict is not None or _DEAD in out
                or not cached.keys().isdisjoint(keys)):
            out = self.allocate(n)
            if out is not None:
                self.register_many(out[:len(keys)], keys)
            return out
        self._head = end
        self.num_free -= n
        ref, held, block_keys, log = self.ref_cnt, self._held, self._keys, self._evicted
        if self.residency is not None:  # before the keys of the evicted blocks are dropped
            self.residency.allocated(out, held)
        evicted = len(log)
        # (the blocks past ``keys``, the partial last one as a rule, get no key)
        for b, key in zip(out, chain(keys, repeat(None))):
            ref[b] = 1
            if held[b]:  # evicted: NOTE: a registered block is its key's block
                del cached[block_keys[b]]
                log.append(b)
            if key is not None and cached.setdefault(key, b) == b:
                block_keys[b] = key
                held[b] = 1
            else:  # no key, or ``key`` twice in ``keys`` (its first block keeps it, as in
                block_keys[b] = None  # register_many)
                held[b] = 0
        evicted = len(log) - evicted
        self.num_cached_free -= evicted
        self.num_evictions += evicted
        if end >= _COMPACT_MIN and 2 * end >= len(q):
            self._compact()
        return out

    def _take_many(self, out: list[int]) -> None:
        """``allocate``'s ref counts and evictions of the popped blocks ``out`` through the
        numpy views (many blocks): the same keys dropped in the same order."""
        index = np.array(out, dtype=np.int64)  # [len(out)]
        self._ref_v[index] = 1
        if not self.num_cached_free:
            return
        evicted = index[self._held_v[index] != 0].tolist()  # in queue order
        if not evicted:
            return
        keys, cached = self._keys, self._cached
        gone = list(gather(keys, evicted))
        if self.on_evict is not None:
            self.on_evict(gone)
        for key in gone:  # NOTE: a registered block is its key's block
            del cached[key]
        for b in evicted:
            keys[b] = None
        self._held_v[evicted] = 0
        self._evicted += evicted
        self.num_cached_free -= len(evicted)
        self.num_evictions += len(evicted)

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block (each at most once); blocks reaching 0 join
        the queue tail in order.

        NOTE: pass a request's blocks tail first (``reversed(table)``) so its tail is
        evicted first.
        """
        ref, q, pos, held = self.ref_cnt, self._q, self._pos, self._held
        if isinstance(blocks, list) and len(blocks) > 1:
            if len(blocks) >= _BULK_MIN:
                self._free_many(blocks)
                return
            if gather(ref, blocks).count(1) == len(blocks):  # all last references
                self._free_sole(blocks)
                return
        t = self._base + len(q)
        freed = cached = 0
        try:
            for b in blocks:
                r = ref[b] - 1
                if r:
                    if r < 0:  # pragma: no cover - internal invariant
                        raise RuntimeError(f"block {b} freed more often than allocated")
                    ref[b] = r
                else:
                    ref[b] = 0
                    q.append(b)
                    pos[b] = t + freed
                    freed += 1
                    cached += held[b]
        finally:
            self.num_free += freed
            self.num_cached_free += cached
            if freed and self.residency is not None:
                self.residency.released(q[len(q) - freed:])

    def _free_sole(self, blocks: list[int]) -> None:
        """``free`` of blocks that each hold one reference (a sequence's own blocks): all
        join the queue. NOTE: one store per block and field, no branch (the common free)."""
        q = self._q
        t = self._base + len(q)
        q += blocks
        if len(blocks) >= _SOLE_BULK_MIN:  # one index array for the pool and the log
            index = np.array(blocks, dtype=np.int64)  # [len(blocks)]
            self._ref_v[index] = 0
            self._pos_v[index] = np.arange(t, t + len(blocks))
            released = index
        else:
            ref, pos = self.ref_cnt, self._pos
            for t, b in enumerate(blocks, t):
                ref[b] = 0
                pos[b] = t
            released = blocks
        self.num_free += len(blocks)
        self.num_cached_free += gather(self._held, blocks).count(1)
        if self.residency is not None:
            self.residency.released(released)

    def _free_many(self, blocks: list[int]) -> None:
        """``free`` through the numpy views (many blocks)."""
        index = np.array(blocks, dtype=np.int64)  # [len(blocks)]
        left = self._ref_v[index] - 1  # [len(blocks)] ref counts after
        if left.min() < 0:  # pragma: no cover - internal invariant
            raise RuntimeError(f"block {index[left.argmin()]} freed more often than allocated")
        self._ref_v[index] = left
        freed = index if not left.any() else index[left == 0]  # NOTE: in order
        t = self._base + len(self._q)
        self._q += freed.tolist()
        if self.residency is not None:
            self.residency.released(freed)
        self._pos_v[freed] = np.arange(t, t + len(freed))
        self.num_free += len(freed)
        self.num_cached_free += int(np.count_nonzero(self._held_v[freed]))

    def touch(self, b: int) -> None:
        """Take one more reference to block ``b`` (a prefix-cache hit or a fork).

        A free cached block is pulled out of the free queue in O(1).
        """
        self.touch_many((b,))

    def touch_many(self, blocks: Sequence[int]) -> None:
        """``touch`` each block in turn (a request's hits, a fork's table: distinct blocks),
        in one call."""
        q, base = self._q, self._base
        if len(blocks) >= _BULK_MIN:
            index = np.array(blocks, dtype=np.int64)  # [len(blocks)]
            refs = self._ref_v[index]  # [len(blocks)]
            self._ref_v[index] = refs + 1
            taken = index[refs == 0]  # the free ones leave the queue
            for entry in (self._pos_v[taken] - base).tolist():
                q[entry] = _DEAD
            cached = int(np.count_nonzero(self._held_v[taken]))
        else:
            ref, pos, taken = self.ref_cnt, self._pos, []
            for b in blocks:
                r = ref[b]
                if not r:
                    q[pos[b] - base] = _DEAD
                    taken.append(b)
                ref[b] = r + 1
            cached = gather(self._held, taken).count(1)
        if len(taken):
            if self.residency is not None:  # free blocks a prompt hit: cached ones
                self.residency.revived(taken if isinstance(taken, list) else taken.tolist())
            self.num_free -= len(taken)
            self.num_cached_free -= cached
            self._dead += len(taken)
            if self._dead > self.num_blocks:
                self._compact()

    # ----------------------------------------------------------- prefix cache
    def lookup(self, key: int) -> int | None:
        """The block registered under ``key`` (allocated or free-but-cached), or None."""
        return self._cached.get(key)

    def lookup_many(self, keys: Iterable[int]) -> list[int | None]:
        """``[lookup(key) for key in keys]`` in one call."""
        return list(map(self._cached.get, keys))

    def holds_any(self, keys: Iterable[int]) -> bool:
        """Whether some block (allocated or free-but-cached) is registered under one of ``keys``."""
        return not self._cached.keys().isdisjoint(keys)

    def register(self, b: int, key: int) -> bool:
        """Register allocated full block ``b`` under ``key``; False if the key is taken.

        NOTE: when another block already holds the same content, ``b`` stays
        unregistered (one block per key, as in nano-vllm).
        """
        if self._held[b] or self._cached.setdefault(key, b) != b:
            return False
        self._keys[b] = key
        self._held[b] = 1
        return True

    def register_many(self, blocks: list[int], keys: Sequence[int]) -> None:
        """``register(b, key)`` for each pair in order (distinct blocks), in one call."""
        block_keys, held, cached = self._keys, self._held, self._cached
        if len(blocks) < _BULK_MIN or 1 in gather(held, blocks):  # few, or some hold a key
            for b, key in zip(blocks, keys):  # register(), inlined
                if not held[b] and cached.setdefault(key, b) == b:
                    block_keys[b] = key
                    held[b] = 1
            return
        # NOTE: setdefault keeps the first block of a key, exactly as registering in order
        got = list(map(cached.setdefault, keys, blocks))
        if got == blocks:  # every key was free (the common case)
            for b, key in zip(blocks, keys):
                block_keys[b] = key
            self._held_v[blocks] = 1
            return
        for b, key, g in zip(blocks, keys, got):
            if g == b:
                block_keys[b] = key
                held[b] = 1

    def evicted_since(self, evictions: int) -> list[int] | None:
        """The blocks whose key was dropped since ``num_evictions`` was ``evictions`` (a
        block may repeat), or None when that is too long ago to tell."""
        start = evictions - self._evicted_base
        return self._evicted[start:] if start >= 0 else None

    def key_of(self, b: int) -> int | None:
        return self._keys[b]

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (allocated or free)."""
        return len(self._cached)
