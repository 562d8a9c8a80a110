"""Matplotlib figures of a run, with one colour per system and per memory category.

Every figure has labelled axes with units and a legend; a system has the same colour
in every figure of every report (run and sweep), see ``system_colors``.
"""

from __future__ import annotations

import base64
import io
import math
import zlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.layout_engine import ConstrainedLayoutEngine  # noqa: E402

CATEGORY_COLORS = {
    "token_states": "#2e7d32",
    "reserved": "#9ccc65",
    "internal_over_reservation": "#ef6c00",
    "internal_rounding": "#ffb74d",
    "internal_page_padding": "#8d6e63",
    "external_fragmentation": "#c62828",
    "idle": "#bdbdbd",
}
CATEGORY_LABELS = {
    "token_states": "token states",
    "reserved": "reserved (will be filled)",
    "internal_over_reservation": "internal: over-reservation",
    "internal_rounding": "internal: allocator rounding",
    "internal_page_padding": "internal: page padding (unified pages)",
    "external_fragmentation": "external fragmentation",
    "idle": "idle (free, nothing waiting for memory)",
}
# The default systems keep these colours everywhere; other names get free palette slots.
FIXED_SYSTEM_COLORS = {
    "paged": "#1f77b4",
    "paged_noprefix": "#17becf",
    "max": "#d62728",
    "pow2": "#ff7f0e",
    "oracle": "#2ca02c",
}
_PALETTE = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#393b79", "#637939",
            "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d"]
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]


def system_colors(names: list[str]) -> dict[str, str]:
    """A colour per system that depends on its name only (so it matches across reports).

    Known systems have fixed colours; any other name hashes to a palette slot, moving
    to the next free slot on a clash within ``names``.
    """
    colors = {n: FIXED_SYSTEM_COLORS[n] for n in names if n in FIXED_SYSTEM_COLORS}
    used = set(colors.values())
    for name in names:
        if name in colors:
            continue
        start = zlib.crc32(name.encode()) % len(_PALETTE)
        for k in range(len(_PALETTE)):
            candidate = _PALETTE[(start + k) % len(_PALETTE)]
            if candidate not in used or k == len(_PALETTE) - 1:
                break
        colors[name] = candidate
        used.add(candidate)
    return colors


def to_data_uri(fig: Figure) -> str:
    """A figure as an inline PNG data URI; closes the figure."""
    buffer = io.BytesIO()
    # NOTE: this module's figures use constrained layout with legends placed "outside", so
    # they need no tight bounding-box pass (which draws a figure twice); other figures
    # (legends anchored outside their axes by hand) keep it.
    constrained = isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    fig.savefig(buffer, format="png", dpi=100, bbox_inches=None if constrained else "tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def subplots(*args, **kwargs):
    """``plt.subplots`` with constrained layout (room for titles and outside legends)."""
    return plt.subplots(*args, layout="constrained", **kwargs)


def _legend_right(ax, **kwargs) -> None:
    """The axes' legend outside the plot, at the figure's upper right."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.figure.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False,
                         **kwargs)


def breakdown_bars(systems: dict[str, dict]) -> Figure:
    """Step-weighted memory breakdown, one stacked bar per system (percent of the pool)."""
    names = list(systems)
    # NOTE: the legend beside the bars is ~3 inches wide: the width leaves room for it
    fig, ax = subplots(figsize=(4.8 + 1.0 * len(names), 4.2))
    bottoms = np.zeros(len(names))
    for category, color in CATEGORY_COLORS.items():
        values = np.array([systems[n]["memory"].get(f"{category}_pct") or 0.0 for n in names])
        ax.bar(names, values, bottom=bottoms, color=color, label=CATEGORY_LABELS[category],
               edgecolor="white", linewidth=0.5)
        bottoms += values
    ax.set_xlabel("system")
    ax.set_ylabel("share of KV pool (%, step-time weighted)")
    ax.set_ylim(0, 100)
    ax.set_title("Where the KV memory goes")
    _legend_right(ax)
    return fig


def memory_timelines(steps: dict[str, pd.DataFrame], capacity: dict[str, int]) -> Figure:
    """Memory categories over simulated time, one panel per system (stacked areas)."""
    names = list(steps)
    fig, axes = subplots(len(names), 1, figsize=(8, 1.9 * len(names) + 0.8), sharex=True,
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        frame = _thin(steps[name])
        # NOTE: step tables written before the page-padding category lack its column
        series = [100.0 * (frame[c] if c in frame else 0 * frame["time_s"]) / capacity[name]
                  for c in CATEGORY_COLORS]
        ax.stackplot(frame["time_s"], *series, colors=list(CATEGORY_COLORS.values()),
                     labels=[CATEGORY_LABELS[c] for c in CATEGORY_COLORS], linewidth=0)
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of pool")
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time (s)")
    _legend_right(axes[0, 0])
    fig.suptitle("KV memory over time")
    return fig


def line_over_time(steps: dict[str, pd.DataFrame], column: str, ylabel: str, title: str,
                   colors: dict[str, str], scale: dict[str, float] | None = None,
                   cumulative: bool = False) -> Figure:
    """One line per system of a step column over time (optionally its running sum)."""
    fig, ax = subplots(figsize=(8, 3.2))
    for name, frame in steps.items():
        values = frame[column].cumsum() if cumulative else frame[column]
        factor = scale[name] if scale else 1.0
        sub = _thin(pd.DataFrame({"time_s": frame["time_s"], "v": values * factor}))
        ax.plot(sub["time_s"], sub["v"], color=colors[name], label=name, linewidth=1.1,
                drawstyle="steps-post")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    _legend_right(ax)
    return fig


def grouped_bars(systems: dict[str, dict], series: dict[str, callable], ylabel: str, title: str,
                 colors: dict[str, str], log: bool = False) -> Figure:
    """Groups on x (one per entry of ``series``), one bar per system in system colours."""
    names = list(systems)
    groups = list(series)
    fig, ax = subplots(figsize=(max(5.0, 1.3 + 1.1 * len(groups) * max(1, len(names)) / 3), 3.4))
    width = 0.8 / max(1, len(names))
    x = np.arange(len(groups))
    for i, name in enumerate(names):
        values = [series[g](systems[name]) for g in groups]
        values = [np.nan if v is None else v for v in values]
        ax.bar(x + (i - (len(names) - 1) / 2) * width, values, width, color=colors[name],
               label=name)
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    _legend_right(ax)
    return fig


def panel_bars(systems: dict[str, dict], panels: list[tuple[str, callable]], title: str,
               colors: dict[str, str]) -> Figure:
    """Panels of one bar per system (the panel's y label says what), two to a row past
    three; a system the quantity does not apply to (its getter returns None) reads "n/a"
    instead of a bar. The x tick labels name the bars: no legend."""
    names = list(systems)
    cols = len(panels) if len(panels) <= 3 else 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = subplots(rows, cols, figsize=(4.6 * cols, 3.1 * rows + 0.4), squeeze=False)
    for ax, (label, get) in zip(axes.flat, panels):
        values = [get(systems[n]) for n in names]
        ax.bar(range(len(names)), [0.0 if v is None else v for v in values],
               color=[colors[n] for n in names])
        ax.set_xticks(range(len(names)), names)
        ax.set_xlim(-0.6, len(names) - 0.4)
        top = max([v for v in values if v is not None] + [0.0]) or 1.0
        ax.set_ylim(0, top * 1.12)
        for i, value in enumerate(values):
            if value is None:
                ax.text(i, top * 0.02, "n/a", ha="center", va="bottom", fontsize=8, color="#666")
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelrotation=30 if len(names) > 4 else 0)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    return fig


def latency_percentiles(systems: dict[str, dict], colors: dict[str, str]) -> Figure:
    """TTFT, TPOT and end-to-end latency at p50/p90/p99, one bar per system."""
    kinds = [("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s/token)"), ("e2e_s", "end-to-end (s)")]
    names = list(systems)
    fig, axes = subplots(1, 3, figsize=(12, 3.4))
    width = 0.8 / max(1, len(names))
    pcts = ["p50", "p90", "p99"]
    x = np.arange(len(pcts))
    for ax, (key, label) in zip(axes, kinds):
        for i, name in enumerate(names):
            lat = systems[name].get("latency", {}).get(key, {})
            values = [lat.get(p) if lat.get(p) is not None else np.nan for p in pcts]
            ax.bar(x + (i - (len(names) - 1) / 2) * width, values, width, color=colors[name],
                   label=name)
        ax.set_xticks(x, pcts)
        ax.set_xlabel("percentile")
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0])
    _legend_right(axes[0])
    fig.suptitle("Latency percentiles")
    return fig


def latency_cdf(requests: dict[str, pd.DataFrame], colors: dict[str, str]) -> Figure:
    """CDF of normalized latency (end-to-end / output tokens) of finished requests."""
    fig, ax = subplots(figsize=(8, 3.4))
    for name, frame in requests.items():
        done = frame[frame["status"] == "finished"]
        if done.empty:
            continue
        values = np.sort(((done["finish_s"] - done["arrival_s"]) / done["output_len"]).to_numpy(float))
        ax.plot(values, np.arange(1, len(values) + 1) / len(values), color=colors[name],
                label=name, linewidth=1.3, drawstyle="steps-post")
    ax.set_xscale("log")
    ax.set_xlabel("normalized latency (s per output token, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title("Normalized latency distribution")
    _legend_right(ax)
    return fig


def _thin(frame: pd.DataFrame, max_points: int = 3000) -> pd.DataFrame:
    """At most ~``max_points`` evenly spaced rows (always the last), so long runs plot quickly."""
    if len(frame) <= max_points:
        return frame
    stride = len(frame) // max_points + 1
    index = list(range(0, len(frame), stride))
    if index[-1] != len(frame) - 1:
        index.append(len(frame) - 1)
    return frame.iloc[index]
