"""How long KV blocks stay in each state: the samples behind results.json's
``kv_residency`` (``harness.metrics.residency``), after vLLM's ``--kv-cache-metrics``
(vllm-project/vllm PR 27793: ``kv_block_lifetime_seconds``,
``kv_block_idle_before_evict_seconds``, ``kv_block_reuse_gap_seconds``).

A block of the pool (``pagebench.allocators.block_pool.BlockPool``) is in use (ref count
> 0) or free; a free block that keeps its prefix-cache key is *cached*. Each transition
ends one interval and gives one sample, on the clock ``now`` (the engine's simulated time,
which the scheduler sets: a step's allocations at its start, its frees at its end):

- ``lifetimes``: in use, from being taken (allocated, or a free cached block hit by a
  prompt) to being released (ref count back to 0);
- ``idle_before_evict``: a cached free block, from its release to its eviction (popped
  for other content, its key dropped);
- ``reuse_gaps``: a cached free block, from its release to the prompt hit that takes it
  back (vLLM counts the gap between any two accesses; here a hit on a block still in use
  is not a gap: the prefix never left the device's working set).

Uncached free blocks hold nothing to evict or reuse: their time free gives no sample.
Every sample is exact on the simulated clock, a plain float difference; the log is pure
Python (numpy for a long allocation or release) and costs an append per block transition.
"""

from __future__ import annotations

from array import array
from typing import Iterator, Sequence

import numpy as np

# From this many blocks on, the transitions are logged at once (numpy). NOTE: measured on
# one transition of n blocks (2026-12-05): numpy is faster from about 30 blocks on for
# ``allocated`` and 14 for ``released`` (55 blocks, an Azure conv admission: 5.9 -> 3.4 us
# and 4.9 -> 2.0 us)
_BULK_MIN = 32


class ResidencyLog:
    """Per-block start times and the three sample lists (see the module docstring)."""

    __slots__ = ("now", "_since", "_since_v", "lifetimes", "idle_before_evict", "reuse_gaps",
                 "_span")

    def __init__(self, num_blocks: int) -> None:
        self.now = 0.0  # the current time (set by the engine's scheduler)
        self._since = array("d", bytes(8 * num_blocks))  # [n] when each block entered its state
        self._since_v = np.frombuffer(self._since, dtype=np.float64)  # [n] the same memory
        self.lifetimes = array("d")
        self.idle_before_evict = array("d")
        self.reuse_gaps = array("d")
        self._span: tuple[Iterator[float], Iterator[float]] | None = None  # see ``span``

    def span(self, evicted_at: list[float], taken_at: list[float]) -> None:
        """The next pops are a fast-forwarded span's, taken for its sequences one after the
        other (``append_batch``) rather than step by step: the k-th popped block leaves the
        queue at ``evicted_at[k]`` (the k-th allocation in step order, as the step-by-step
        run pops it) and is in use from ``taken_at[k]`` (its own sequence's step). The
        blocks then differ from the step-by-step run's, their samples do not: a block's
        history follows its owner and its place in the queue. Ends at ``end_span``."""
        self._span = (iter(evicted_at), iter(taken_at))

    def end_span(self, now: float) -> None:
        self._span, self.now = None, now

    def allocated(self, blocks: Sequence[int], cached: bytearray) -> None:
        """``blocks`` popped from the free queue now; ``cached[b]`` is 1 for a block that
        still held its key (it is evicted): the pool's flag buffer."""
        since, idle = self._since, self.idle_before_evict
        if self._span is not None:
            # NOTE: zip takes the next time of each iterator only while blocks remain
            for b, out, taken in zip(blocks, *self._span):
                if cached[b]:
                    idle.append(out - since[b])
                since[b] = taken
            return
        now = self.now
        if len(blocks) >= _BULK_MIN:  # NOTE: ``cached`` is then the pool's flag buffer
            index = np.asarray(blocks, dtype=np.int64)  # [len(blocks)]
            flags = np.frombuffer(cached, dtype=np.uint8)[index]  # [len(blocks)]
            idle.frombytes((now - self._since_v[index[flags != 0]]).tobytes())
            self._since_v[index] = now
            return
        for b in blocks:
            if cached[b]:
                idle.append(now - since[b])
            since[b] = now

    def __getstate__(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__ if name != "_since_v"}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self._since_v = np.frombuffer(self._since, dtype=np.float64)

    def released(self, blocks: Sequence[int] | np.ndarray) -> None:
        """``blocks`` whose ref count fell to 0 now (many at once: an ndarray or list)."""
        now = self.now
        if len(blocks) >= _BULK_MIN:
            index = np.asarray(blocks, dtype=np.int64)  # [len(blocks)]
            self.lifetimes.frombytes((now - self._since_v[index]).tobytes())
            self._since_v[index] = now
            return
        since, lifetimes = self._since, self.lifetimes
        for b in blocks:
            lifetimes.append(now - since[b])
            since[b] = now

    def revived(self, blocks: Sequence[int]) -> None:
        """Free cached ``blocks`` a prompt hit now (taken back out of the free queue)."""
        now, since, gaps = self.now, self._since, self.reuse_gaps
        if len(blocks) >= _BULK_MIN:
            index = np.asarray(blocks, dtype=np.int64)  # [len(blocks)]
            gaps.frombytes((now - self._since_v[index]).tobytes())
            self._since_v[index] = now
            return
        for b in blocks:
            gaps.append(now - since[b])
            since[b] = now
