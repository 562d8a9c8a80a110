"""The pipeline every trace loader shares once its rows are parsed.

Order: length filters -> time window -> first ``num_requests`` rows -> clip to
max_model_len -> arrival times -> token ids. Clipping comes before token ids so
that a dropped request never costs its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from harness.errors import ConfigError
from harness.workloads.arrivals import generate_arrivals, replay_arrivals
from harness.workloads.registry import BuildContext, Draft, clip_lengths
from harness.workloads.spec import TraceSpec

# (row indices into the parsed table, prompt lengths) -> one int32 prompt per row
Materializer = Callable[[np.ndarray, np.ndarray], "list[np.ndarray]"]


@dataclass(frozen=True)
class TraceRows:
    """Valid rows of a trace, in file order."""

    path: str
    lines: np.ndarray  # [n] int64, line (parquet: row) number in the file
    index: np.ndarray  # [n] int64, row index in the parsed table (for loader-specific data)
    input_len: np.ndarray  # [n] int64
    output_len: np.ndarray  # [n] int64
    timestamps: np.ndarray | None = None  # [n] float64 seconds, non-decreasing
    trace_start: float = 0.0  # the first valid timestamp: time-window origin

    @classmethod
    def from_mask(cls, path: str, lines, keep: np.ndarray, input_len, output_len,
                  timestamps=None) -> "TraceRows":
        idx = np.flatnonzero(keep)
        ts = None if timestamps is None else np.asarray(timestamps, dtype=np.float64)[idx]
        return cls(path=path, lines=np.asarray(lines, dtype=np.int64)[idx], index=idx,
                   input_len=np.asarray(input_len, dtype=np.int64)[idx],
                   output_len=np.asarray(output_len, dtype=np.int64)[idx], timestamps=ts,
                   trace_start=float(ts[0]) if ts is not None and ts.size else 0.0)

    def __len__(self) -> int:
        return len(self.lines)

    def take(self, sel) -> "TraceRows":
        return replace(self, lines=self.lines[sel], index=self.index[sel], input_len=self.input_len[sel],
                       output_len=self.output_len[sel],
                       timestamps=None if self.timestamps is None else self.timestamps[sel])

    def drop(self, mask: np.ndarray, reason: str, ctx: BuildContext) -> "TraceRows":
        """Remove rows where ``mask`` is true, counting them as filtered for ``reason``."""
        count = int(mask.sum())
        if count:
            ctx.tally.filtered[reason] += count
            return self.take(~mask)
        return self


def length_filters(rows: TraceRows, spec: TraceSpec, ctx: BuildContext) -> TraceRows:
    if spec.min_input_len is not None:
        rows = rows.drop(rows.input_len < spec.min_input_len,
                         f"input_len < min_input_len={spec.min_input_len}", ctx)
    if spec.min_output_len is not None:
        rows = rows.drop(rows.output_len < spec.min_output_len,
                         f"output_len < min_output_len={spec.min_output_len}", ctx)
    if spec.max_input_len is not None:
        rows = rows.drop(rows.input_len > spec.max_input_len,
                         f"input_len > max_input_len={spec.max_input_len}", ctx)
    if spec.max_total_len is not None:
        rows = rows.drop(rows.input_len + rows.output_len > spec.max_total_len,
                         f"input_len + output_len > max_total_len={spec.max_total_len}", ctx)
    return rows


def replay(rows: TraceRows, spec: TraceSpec, ctx: BuildContext,
           materialize: Materializer | None = None) -> list[Draft]:
    """Filter, window, select, clip, time and tokenise trace rows into drafts."""
    where = ctx.where
    rows = length_filters(rows, spec, ctx)
    origin = None
    if spec.start_s is not None or spec.end_s is not None:
        if rows.timestamps is None:
            raise ConfigError(f"{where}.start_s: a time window needs timestamps, and this trace has none; "
                              "remove start_s/end_s or give a timestamp column")
        start = spec.start_s or 0.0
        end = spec.end_s if spec.end_s is not None else np.inf
        relative = rows.timestamps - rows.trace_start
        rows = rows.drop((relative < start) | (relative >= end), "outside the time window", ctx)
        origin = rows.trace_start + start
    if spec.num_requests is not None:
        rows = rows.take(slice(0, spec.num_requests))
    keep, prompt_lens, output_lens = clip_lengths(rows.input_len, rows.output_len, ctx.max_model_len,
                                                  spec.clip, ctx.tally)
    rows, prompt_lens, output_lens = rows.take(keep), prompt_lens[keep], output_lens[keep]
    if spec.arrival.process == "trace":
        if rows.timestamps is None:
            raise ConfigError(f"{where}.arrival.process: 'trace' needs timestamps and this trace has none; "
                              f"use poisson, gamma or offline (e.g. {where}.arrival.process=poisson "
                              f"{where}.arrival.rate=2), or give a timestamp column")
        times = replay_arrivals(spec.arrival, rows.timestamps, origin, f"{where}.arrival")
    else:
        times = generate_arrivals(spec.arrival, len(rows), ctx.rng, f"{where}.arrival")
    if materialize is None:
        prompts = ctx.tokens.fresh_many(prompt_lens)
    else:
        prompts = materialize(rows.index, prompt_lens)
    stem = Path(rows.path).name
    return [Draft(arrival_time=t, prompt=p, output_len=o, name=f"{stem}:{line}")
            for t, p, o, line in zip(times.tolist(), prompts, output_lens.tolist(), rows.lines.tolist())]
