"""Matplotlib figures of a run, with one colour per system and per memory category."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

CATEGORY_COLORS = {
    "token_states": "#2e7d32",
    "reserved": "#9ccc65",
    "internal_over_reservation": "#ef6c00",
    "internal_rounding": "#ffb74d",
    "external_fragmentation": "#c62828",
    "idle": "#bdbdbd",
}
CATEGORY_LABELS = {
    "token_states": "token states",
    "reserved": "reserved (will be filled)",
    "internal_over_reservation": "internal: over-reservation",
    "internal_rounding": "internal: allocator rounding",
    "external_fragmentation": "external fragmentation",
    "idle": "idle (free, nothing waiting)",
}
_PALETTE = plt.get_cmap("tab10").colors


def system_colors(names: list[str]) -> dict[str, tuple]:
    """A stable colour per system name (same order -> same colour in every figure)."""
    return {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(names)}


def to_data_uri(fig: Figure) -> str:
    """A figure as an inline PNG data URI; closes the figure."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def breakdown_bars(systems: dict[str, dict]) -> Figure:
    """Step-weighted memory breakdown, one stacked bar per system (percent of the pool)."""
    names = list(systems)
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(names), 4.2))
    bottoms = [0.0] * len(names)
    for category, color in CATEGORY_COLORS.items():
        values = [systems[n]["memory"][f"{category}_pct"] or 0.0 for n in names]
        ax.bar(names, values, bottom=bottoms, color=color, label=CATEGORY_LABELS[category],
               edgecolor="white", linewidth=0.5)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_ylabel("share of KV pool (%, step-time weighted)")
    ax.set_ylim(0, 100)
    ax.set_title("Where the KV memory goes")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return fig


def memory_timelines(steps: dict[str, pd.DataFrame], capacity: dict[str, int]) -> Figure:
    """Memory categories over simulated time, one panel per system (stacked areas)."""
    names = list(steps)
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.1 * len(names) + 0.6), sharex=True,
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        frame = _thin(steps[name])
        series = [100.0 * frame[c] / capacity[name] for c in CATEGORY_COLORS]
        ax.stackplot(frame["time_s"], *series, colors=list(CATEGORY_COLORS.values()),
                     labels=[CATEGORY_LABELS[c] for c in CATEGORY_COLORS], linewidth=0)
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of pool")
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("simulated time (s)")
    axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    fig.suptitle("KV memory over time")
    return fig


def line_over_time(steps: dict[str, pd.DataFrame], column: str, ylabel: str, title: str,
                   colors: dict[str, tuple], scale: dict[str, float] | None = None) -> Figure:
    """One line per system of a step column over simulated time."""
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for name, frame in steps.items():
        frame = _thin(frame)
        factor = scale[name] if scale else 1.0
        ax.plot(frame["time_s"], frame[column] * factor, color=colors[name], label=name,
                linewidth=1)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, frameon=False)
    return fig


def _thin(frame: pd.DataFrame, max_points: int = 4000) -> pd.DataFrame:
    """At most ``max_points`` evenly spaced rows, so long runs plot quickly."""
    if len(frame) <= max_points:
        return frame
    return frame.iloc[:: len(frame) // max_points + 1]
