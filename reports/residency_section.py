"""The run report's KV residency part (results.json ``kv_residency``, systems on a block
pool): per system, p50/p90/p99 of block lifetime, idle time before eviction and reuse gap
(a table), and their histograms (one panel a metric, a step line a system)."""

from __future__ import annotations

from matplotlib.figure import Figure

from pagebench.reports import figures as F
from pagebench.reports.figure_batch import PendingFigure
from pagebench.reports.html import table

# results.json key -> the panel's and the table's label
METRICS = {"kv_block_lifetime_seconds": "block lifetime (in use)",
           "kv_block_idle_before_evict_seconds": "idle before eviction (cached, free)",
           "kv_block_reuse_gap_seconds": "reuse gap (release to prompt hit)"}


def residency_histograms(systems: dict[str, dict], colors: dict[str, str]) -> Figure:
    """One panel a metric: each system's histogram as a step line (counts, log scale)."""
    fig, axes = F.subplots(1, len(METRICS), figsize=(12, 3.4))
    for ax, (key, label) in zip(axes, METRICS.items()):
        for name, summary in systems.items():
            hist = (summary.get(key) or {}).get("histogram")
            if not hist:
                continue
            ax.stairs(hist["counts"], hist["edges"], label=name, color=colors.get(name))
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("seconds (simulated clock)")
        ax.set_yscale("symlog", linthresh=1)
    axes[0].set_ylabel("blocks")
    F._legend_right(axes[-1])
    return fig


def residency_parts(systems: dict[str, dict], colors: dict[str, str]) -> list:
    """``<h3>``, a note, the percentile table and the histograms; nothing when no system
    recorded residency (contiguous systems, or engine.kv_residency=false)."""
    recorded = {name: s["kv_residency"] for name, s in systems.items()
                if isinstance(s.get("kv_residency"), dict)}
    if not recorded:
        return []
    rows = []
    for name, res in recorded.items():
        for key, label in METRICS.items():
            d = res.get(key) or {}
            rows.append([name, label, d.get("count"), d.get("p50"), d.get("p90"), d.get("p99"),
                         d.get("max")])
    note = ("<p class='note'>Each KV block's time in use (allocated or revived by a prefix hit, "
            "to released), and, once released with its prefix-cache key, free until it is "
            "evicted (popped for other content) or hit again (the reuse gap): exact on the "
            "simulated clock (vLLM's --kv-cache-metrics names). Idle time near 0 means the pool "
            "recycles cached blocks at once: a larger pool would keep them for later hits.</p>")
    return ["<h3>KV block residency (seconds)</h3>", note,
            table(["system", "metric", "samples", "p50", "p90", "p99", "max"], rows,
                  text_columns=(0, 1), digits=3, css_id="residency-table"),
            PendingFigure(lambda: residency_histograms(recorded, colors),
                          "KV block residency histograms",
                          "Histograms of the three residency times per system (20 equal bins "
                          "from 0 to each system's longest; symlog counts).")]
