"""NVML telemetry timelines (samples written by ``harness/engine/nvml.py``), whatever columns exist.

The sampler's columns are matched by name: a time column (``time_s``, ``t_s``,
``elapsed_s`` or ``timestamp``), an optional ``system`` column, and any numeric
column whose name tells its quantity (power, utilisation, memory, clock,
temperature, energy). Unknown numeric columns get a panel of their own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

TIME_COLUMNS = ("time_s", "t_s", "elapsed_s", "timestamp_s", "timestamp", "time")
# (substring of the column name, axis label with unit); first match wins.
QUANTITIES = (
    ("power", "power (W)"),
    ("energy", "energy (J)"),
    ("util", "utilisation (%)"),
    ("temp", "temperature (°C)"),
    ("clock", "clock (MHz)"),
    ("mhz", "clock (MHz)"),
    ("mem", "memory used"),
)


def _time_column(frame: pd.DataFrame) -> str | None:
    for name in TIME_COLUMNS:
        if name in frame.columns:
            return name
    return None


def _unit_scale(column: str) -> tuple[float, str]:
    """Scale to a readable unit from the column's suffix."""
    lower = column.lower()
    if lower.endswith("_mw"):
        return 1e-3, "W"
    if lower.endswith("_mj"):
        return 1e-3, "J"
    if lower.endswith("_bytes") or lower.endswith("_b"):
        return 1 / 2**30, "GiB"
    if lower.endswith("_mib") or lower.endswith("_mb"):
        return 1 / 1024, "GiB"
    return 1.0, ""


def telemetry_panels(frame: pd.DataFrame) -> dict[str, list[str]]:
    """Axis label -> the numeric columns drawn on it."""
    time_col = _time_column(frame)
    panels: dict[str, list[str]] = {}
    for column in frame.columns:
        if column in (time_col, "system", "step", "gpu_index", "device_index", "index"):
            continue
        if not pd.api.types.is_numeric_dtype(frame[column]) or frame[column].isna().all():
            continue
        lower = column.lower()
        label = next((lab for key, lab in QUANTITIES if key in lower), column)
        scale, unit = _unit_scale(column)
        if label == "memory used":
            label = f"memory used ({unit or 'as sampled'})"
        elif unit and "(" in label:
            label = label.split(" (")[0] + f" ({unit})"
        panels.setdefault(label, []).append(column)
    return panels


def telemetry_figure(frame: pd.DataFrame, colors: dict[str, str]) -> Figure | None:
    """One panel per quantity over time; one line per column (and per system if given)."""
    time_col = _time_column(frame)
    panels = telemetry_panels(frame)
    if time_col is None or not panels:
        return None
    times = frame[time_col].to_numpy(float)
    if time_col.startswith("timestamp") or time_col == "time":
        times = times - np.nanmin(times)
    frame = frame.assign(_t=times)
    groups = list(frame.groupby("system", sort=False)) if "system" in frame.columns else [(None, frame)]
    # NOTE: not a pyplot figure: the report may draw (and close) it in a worker process
    fig = Figure(figsize=(8, 1.9 * len(panels) + 0.8), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, (label, columns) in zip(axes[:, 0], panels.items()):
        for system, sub in groups:
            for k, column in enumerate(columns):
                scale, _ = _unit_scale(column)
                name = column if system is None else f"{system}: {column}"
                color = colors.get(system) if system is not None else None
                ax.plot(sub["_t"], sub[column].to_numpy(float) * scale, linestyle=styles[k % 4],
                        color=color, label=name, linewidth=1.0)
        ax.set_ylabel(label, fontsize=8)
        ax.legend(loc="upper left", fontsize=7, frameon=False)
    axes[-1, 0].set_xlabel("time since the first sample (s)")
    fig.suptitle("GPU telemetry (NVML)")
    return fig
