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
Python and costs three list appends per block transition.
"""

from __future__ import annotations

from array import array
from typing import Iterable, Sequence


class ResidencyLog:
    """Per-block start times and the three sample lists (see the module docstring)."""

    __slots__ = ("now", "_since", "lifetimes", "idle_before_evict", "reuse_gaps")

    def __init__(self, num_blocks: int) -> None:
        self.now = 0.0  # the current time (set by the engine's scheduler)
        self._since = [0.0] * num_blocks  # when each block entered its state
        self.lifetimes = array("d")
        self.idle_before_evict = array("d")
        self.reuse_gaps = array("d")

    def allocated(self, blocks: Iterable[int], cached: Sequence[int]) -> None:
        """``blocks`` popped from the free queue now; ``cached[b]`` is true for a block that
        still held its key (it is evicted)."""
        now, since, idle = self.now, self._since, self.idle_before_evict
        for b in blocks:
            if cached[b]:
                idle.append(now - since[b])
            since[b] = now

    def released(self, blocks: Iterable[int]) -> None:
        """``blocks`` whose ref count fell to 0 now."""
        now, since, lifetimes = self.now, self._since, self.lifetimes
        for b in blocks:
            lifetimes.append(now - since[b])
            since[b] = now

    def revived(self, blocks: Iterable[int]) -> None:
        """Free cached ``blocks`` a prompt hit now (taken back out of the free queue)."""
        now, since, gaps = self.now, self._since, self.reuse_gaps
        for b in blocks:
            gaps.append(now - since[b])
            since[b] = now
