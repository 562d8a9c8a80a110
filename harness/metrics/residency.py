"""KV block residency for results.json (``kv_residency``): the distributions of block
lifetime, idle time before eviction and reuse gap that a system's ``ResidencyLog``
(``pagebench.allocators.residency``) sampled on the simulated clock, named as vLLM's
``--kv-cache-metrics`` histograms are (vllm-project/vllm PR 27793)."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

# results.json key -> the log's sample list, and what a sample is
METRICS = {
    "kv_block_lifetime_seconds": ("lifetimes", "in use: taken (allocated or hit while free) "
                                               "to released"),
    "kv_block_idle_before_evict_seconds": ("idle_before_evict", "cached and free: released to "
                                                                "evicted"),
    "kv_block_reuse_gap_seconds": ("reuse_gaps", "cached and free: released to the prompt hit "
                                                 "that takes it back"),
}
PERCENTILES = (50, 90, 99)
HISTOGRAM_BINS = 20


def distribution(samples) -> dict[str, Any]:
    """Count, mean, p50/p90/p99 (linear interpolation between order statistics), max and
    a histogram of ``HISTOGRAM_BINS`` equal bins from 0 to the max; None figures when empty."""
    values = np.frombuffer(samples, dtype=np.float64) if len(samples) else np.zeros(0)  # [n]
    if not len(values):
        return {"count": 0, "mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None,
                "histogram": None}
    top = float(values.max())
    counts, edges = np.histogram(values, bins=HISTOGRAM_BINS, range=(0.0, top if top > 0 else 1.0))
    return {"count": int(len(values)), "mean": float(values.mean()),
            **{f"p{p}": float(q) for p, q in zip(PERCENTILES, np.percentile(values, PERCENTILES))},
            "max": top, "histogram": {"edges": edges.tolist(), "counts": counts.tolist()}}


def residency_summary(managers: list) -> dict[str, Any]:
    """``kv_residency`` of one system (its managers: one a replica, each with a block pool
    and its ``ResidencyLog``): each metric's distribution over every replica's samples, and
    the blocks still in use or cached at the end (intervals the run did not close, left out
    of the samples)."""
    pools = [manager.pool for manager in managers]
    summary: dict[str, Any] = {}
    for name, (attr, _) in METRICS.items():
        samples = array("d")
        for pool in pools:
            samples.extend(getattr(pool.residency, attr))
        summary[name] = distribution(samples)
    summary["in_use_at_end"] = sum(pool.num_blocks - pool.num_free for pool in pools)
    summary["cached_free_at_end"] = sum(pool.num_cached_free for pool in pools)
    return summary
