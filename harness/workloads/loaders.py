"""Trace loaders for length-only traces: Azure LLM 2023/2024, Mooncake, BurstGPT, any table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.workloads.registry import BuildContext, Draft, register
from harness.workloads.replay import TraceRows, replay
from harness.workloads.rows import RowParser
from harness.workloads.spec import TraceSpec, check
from harness.workloads.tables import read_table, resolve_path


def _rows(spec: TraceSpec, ctx: BuildContext, fmt: str, input_col: str, output_col: str,
          time_col: str | None, unit: str, extra: tuple[str, ...] = (), min_output: int = 1):
    """Read and parse the common columns; returns (parser, keep-mask builder inputs)."""
    path = resolve_path(spec.path, ctx.where)
    columns = [input_col, output_col] + ([time_col] if time_col else []) + list(extra)
    table = read_table(path, fmt, list(dict.fromkeys(columns)), ctx.where)
    parser = RowParser(table, spec.on_error)
    times = parser.times(time_col, unit) if time_col else None
    input_len = parser.ints(input_col)
    output_len = parser.ints(output_col, min_value=min_output)
    return parser, input_len, output_len, times


def _finish(parser: RowParser, ctx: BuildContext, input_len, output_len, times, time_col) -> TraceRows:
    if times is not None:
        parser.check_monotonic(time_col, times)
    keep = parser.resolve(ctx.tally)
    return TraceRows.from_mask(parser.table.path, parser.table.lines, keep, input_len, output_len, times)


# --- Azure LLM inference trace ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AzureSpec(TraceSpec):
    pass


@register("azure", AzureSpec)
def build_azure(spec: AzureSpec, ctx: BuildContext) -> list[Draft]:
    """Azure LLM inference trace CSV: TIMESTAMP (date-time), ContextTokens, GeneratedTokens."""
    parser, inp, out, times = _rows(spec, ctx, spec.format, "ContextTokens", "GeneratedTokens",
                                    "TIMESTAMP", "datetime")
    return replay(_finish(parser, ctx, inp, out, times, "TIMESTAMP"), spec, ctx)


# --- Mooncake ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MooncakeSpec(TraceSpec):
    block_tokens: int = 512  # tokens per hash id in the trace (512 in the FAST'25 release)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.block_tokens >= 1, "block_tokens", f"must be >= 1, got {self.block_tokens!r}")


@register("mooncake", MooncakeSpec)
def build_mooncake(spec: MooncakeSpec, ctx: BuildContext) -> list[Draft]:
    """Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (one per block)."""
    ctx.tokens.claim_hashes(ctx.where)
    parser, inp, out, times = _rows(spec, ctx, spec.format, "input_length", "output_length", "timestamp",
                                    "ms", extra=("hash_ids",))
    raw_hashes = parser.table.columns["hash_ids"]
    counts = np.zeros(len(raw_hashes), dtype=np.int64)
    flat: list[int] = []
    limit = ctx.tokens.hash_id_limit(spec.block_tokens)  # (the trace's are remapped below 2**20)
    for row, hashes in enumerate(raw_hashes):
        if row in parser.errors:
            continue
        if not isinstance(hashes, list) or (hashes and (set(map(type, hashes)) != {int} or min(hashes) < 0
                                                        or max(hashes) >= limit)):
            parser.error(row, "hash_ids", f"not a list of integers in [0, {limit:,}) (the ids "
                         f"{spec.block_tokens}-token blocks can take)",
                         repr(hashes)[:80] if hashes is not None else "missing")
            continue
        expected = -(-int(inp[row]) // spec.block_tokens)
        if len(hashes) != expected:
            parser.error(row, "hash_ids", "wrong number of hash ids",
                         f"{len(hashes)} ids for input_length {inp[row]} at {spec.block_tokens} tokens per "
                         f"block (expected {expected}; is workload.block_tokens right?)")
            continue
        counts[row] = len(hashes)
        flat.extend(hashes)
    rows = _finish(parser, ctx, inp, out, times, "timestamp")
    # CSR over table rows: rows that failed contribute no hashes (count 0).
    offsets = np.concatenate([[0], np.cumsum(counts)])
    hash_ids = np.asarray(flat, dtype=np.int64)

    def materialize(index: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
        starts = offsets[index]
        sel_offsets = np.concatenate([[0], np.cumsum(counts[index])])
        picked = np.repeat(starts - sel_offsets[:-1], counts[index]) + np.arange(int(sel_offsets[-1]))
        return ctx.tokens.from_hash_blocks(hash_ids[picked], sel_offsets, lengths, spec.block_tokens,
                                           path=parser.table.path)

    return replay(rows, spec, ctx, materialize)


# --- BurstGPT -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BurstGPTSpec(TraceSpec):
    models: tuple[str, ...] | None = None  # keep only these Model values (e.g. [ChatGPT]); null = all
    log_types: tuple[str, ...] | None = None  # keep only these Log Type values; null = all


@register("burstgpt", BurstGPTSpec)
def build_burstgpt(spec: BurstGPTSpec, ctx: BuildContext) -> list[Draft]:
    """BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, Total tokens, Log Type."""
    parser, inp, out, times = _rows(spec, ctx, spec.format, "Request tokens", "Response tokens", "Timestamp",
                                    "s", extra=("Model", "Log Type"), min_output=0)
    models = np.array(parser.strings("Model"), dtype=object)
    log_types = np.array(parser.strings("Log Type"), dtype=object)
    rows = _finish(parser, ctx, inp, out, times, "Timestamp")
    if spec.models is not None:
        rows = rows.drop(~np.isin(models[rows.index], list(spec.models)), "model not in workload.models", ctx)
    if spec.log_types is not None:
        rows = rows.drop(~np.isin(log_types[rows.index], list(spec.log_types)),
                         "log type not in workload.log_types", ctx)
    # BurstGPT records a failed request as zero response tokens.
    rows = rows.drop(rows.output_len == 0, "failed request (zero response tokens)", ctx)
    return replay(rows, spec, ctx)


# --- Any table of per-request lengths -----------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TableSpec(TraceSpec):
    input_column: str
    output_column: str
    timestamp_column: str | None = None
    timestamp_unit: str = "s"

    def __post_init__(self) -> None:
        super().__post_init__()
        units = ("s", "ms", "us", "ns", "datetime")
        check(self.timestamp_unit in units, "timestamp_unit",
              f"must be one of {', '.join(units)}; got {self.timestamp_unit!r}")
        used = (self.arrival.process == "trace" or self.start_s is not None
                or self.end_s is not None)
        check(self.timestamp_column is None or used, "timestamp_column",
              f"is read only with arrival.process=trace (or a time window, start_s/end_s), "
              f"and this arrival process is {self.arrival.process}, which ignores the trace's "
              f"times: set workload.arrival.process=trace, or remove it (timestamp_column=null)")


@register("table", TableSpec)
def build_table(spec: TableSpec, ctx: BuildContext) -> list[Draft]:
    """Any CSV/JSONL/JSON/parquet with per-request input and output lengths (optional timestamps)."""
    parser, inp, out, times = _rows(spec, ctx, spec.format, spec.input_column, spec.output_column,
                                    spec.timestamp_column, spec.timestamp_unit)
    return replay(_finish(parser, ctx, inp, out, times, spec.timestamp_column), spec, ctx)
