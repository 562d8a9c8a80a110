"""Step and request records, and the summaries results.json reports."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter

import numpy as np
import pandas as pd

from pagebench.allocators.base import MemoryBreakdown
from harness.metrics.step_spans import StepSpans

# Per-step columns, in table order.
STEP_COLUMNS = (
    "step", "time_s", "duration_s", "num_seqs", "num_batched_tokens", "num_prefill_tokens",
    "num_waiting", "num_preempted", "token_states", "reserved", "internal_over_reservation",
    "internal_rounding", "internal_page_padding", "external_fragmentation", "idle",
    "logical_tokens", "allocated_slots", "largest_free_extent", "cached_free_slots",
)
MEMORY_CATEGORIES = ("token_states", "reserved", "internal_over_reservation",
                     "internal_rounding", "internal_page_padding", "external_fragmentation", "idle")
INTERNAL_CATEGORIES = ("internal_over_reservation", "internal_rounding", "internal_page_padding")
REQUEST_COLUMNS = (
    "request_id", "name", "arrival_s", "first_token_s", "finish_s", "prompt_len", "output_len",
    "num_seqs", "cached_tokens", "preemptions", "swaps", "status",
)


# The step columns a MemoryBreakdown gives (its fields of the same names), read in one call.
MEMORY_STEP_COLUMNS = STEP_COLUMNS[STEP_COLUMNS.index("token_states"):]
_memory_row = attrgetter(*MEMORY_STEP_COLUMNS)


@dataclass
class RunRecorder:
    """Collects one row per engine step and one per request, column-wise (cheap appends).

    NOTE: a fast-forwarded span's rows are one record in ``spans`` (``record_span``): its
    steps are in ``steps["step"]``, but not in ``steps``' other columns; ``step_table``
    lays them in.
    """

    capacity_slots: int
    steps: dict[str, list] = field(default_factory=lambda: {c: [] for c in STEP_COLUMNS})
    spans: StepSpans = field(default_factory=lambda: StepSpans(STEP_COLUMNS[1:]))
    requests: list[tuple] = field(default_factory=list)
    # Columns after STEP_COLUMNS, one value per step: the operator cost model's seconds per
    # phase (``<phase>_s``, harness.engine.cost_operator.PHASES), set after the run
    extra: dict[str, list] = field(default_factory=dict)
    # Each step's ``MemoryBreakdown.group_blocks`` (a hybrid manager's blocks per layer kind;
    # nothing for the others): columns ``layer_group<i>_blocks`` of the step table
    group_blocks: list[tuple[int, ...]] = field(default_factory=list)
    # request id -> its SequenceGroup.token_breaks (only finished requests that had some):
    # with the step table they give every output token's time (harness.metrics.latency)
    token_breaks: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    # NOTE: the column lists in STEP_COLUMNS order: ``record_step`` runs once per scheduled
    # step (the columns are appended in place, never replaced). ``column.append(value)`` is
    # a specialised list append on Python 3.11; a bound ``append`` kept in a list is a
    # generic call (Azure conv paged, 3,000 requests, callgrind: 13,653.6M -> 13,640.0M)
    _columns: list[list] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._columns = [self.steps[name] for name in STEP_COLUMNS]

    def record_step(self, time_s: float, duration_s: float, num_seqs: int, num_batched_tokens: int,
                    num_prefill_tokens: int, num_waiting: int, num_preempted: int,
                    memory: MemoryBreakdown) -> None:
        row = (len(self.steps["step"]), time_s, duration_s, num_seqs, num_batched_tokens,
               num_prefill_tokens, num_waiting, num_preempted, *_memory_row(memory))
        for column, value in zip(self._columns, row):
            column.append(value)
        if memory.group_blocks:
            self.group_blocks.append(memory.group_blocks)

    def record_span(self, span: int, row: tuple) -> None:
        """The rows of ``span`` fast-forwarded steps: ``row`` gives each step column but
        ``step``, in ``STEP_COLUMNS`` order, as one number (every step's), a range or a list
        of ``span`` values."""
        steps = self.steps["step"]
        first = len(steps)
        steps.extend(range(first, first + span))
        self.spans.add(first, span, row)

    def record_request(self, row: tuple) -> None:
        self.requests.append(row)

    def add_columns(self, columns: dict[str, list]) -> None:
        """Columns of one value per recorded step (the executor's phase times), after
        ``STEP_COLUMNS`` in the step table."""
        count = len(self.steps["step"])
        for name, values in columns.items():
            if len(values) < count:
                raise ValueError(f"column {name} has {len(values)} values for {count} steps")
            self.extra[name] = values[:count]

    def step_table(self) -> pd.DataFrame:
        # NOTE: numpy converts the lists ~10x faster than pandas does
        columns = {name: _column(self.steps[name]) for name in STEP_COLUMNS}
        if self.spans:
            columns = self.spans.merge(columns, _column)
        columns.update((name, _float_column(values)) for name, values in self.extra.items())
        if self.group_blocks:
            if len(self.group_blocks) != len(self.steps["step"]):  # pragma: no cover - invariant
                raise RuntimeError("group_blocks were recorded for only some steps (a closed-form "
                                   "fast-forward writes none: a layer-group manager may declare "
                                   "only bulk_decode='hybrid')")
            for i, values in enumerate(zip(*self.group_blocks)):
                columns[f"layer_group{i}_blocks"] = np.asarray(values)
        return pd.DataFrame(columns, copy=False)  # NOTE: the arrays as they are (no 2-D copy)

    def request_table(self) -> pd.DataFrame:
        """One row per request (``REQUEST_COLUMNS``), by request id.

        NOTE: built column by column, the rows sorted first (a request's row is recorded
        once: its id is unique), the number columns in one pass each (``_one_pass``): half
        the CPU of pandas reading the rows as tuples, which infers every column from
        objects. A column ``array.array`` refuses (a None among the floats: a request that
        never ran) or of strings is left to pandas' inference, as before.
        """
        if not self.requests:
            return pd.DataFrame([], columns=list(REQUEST_COLUMNS))
        rows = sorted(self.requests, key=itemgetter(0))  # (stable, as sort_values' "stable")
        columns = {}
        for name, values in zip(REQUEST_COLUMNS, zip(*rows)):
            values = list(values)
            column = _one_pass(values)
            columns[name] = values if column is None else column  # (a list: pandas infers)
        return pd.DataFrame(columns, copy=False)


def _column(values: list) -> np.ndarray:
    """``np.asarray(values)``, in one pass over the list when it starts with a Python int
    (a step table's counts) or float (its times).

    NOTE: ``np.asarray`` reads every element twice (its dtype, then its value); the
    engine's number objects lie scattered in memory by the end of a run, so the single
    pass of ``array.array`` is about a quarter cheaper. What it refuses (a float among the
    ints, None, a string, an int past the type's range) and a leading bool take
    ``np.asarray``'s way.
    """
    column = _one_pass(values) if values else None
    return np.asarray(values) if column is None else column


def _one_pass(values: list) -> np.ndarray | None:
    """``values`` (not empty) as an int64 or float64 array read in one pass by
    ``array.array`` when it starts with a Python int or float and ``array.array`` takes
    every value; else None."""
    kind = _ARRAY_KINDS.get(type(values[0]))
    if kind is None:
        return None
    code, dtype = kind
    try:
        return np.frombuffer(array(code, values), dtype=dtype)
    except (TypeError, OverflowError):
        return None


# the array.array type code and the dtype of a list that starts with an int or a float
_ARRAY_KINDS = {int: ("q", np.int64), float: ("d", np.float64)}


def _float_column(values) -> np.ndarray:
    """``np.asarray(values, dtype=float)``, in one pass (``_column``) for a list."""
    if isinstance(values, list):
        try:
            return np.frombuffer(array("d", values), dtype=np.float64)
        except (TypeError, OverflowError):
            pass
    return np.asarray(values, dtype=float)


def _round(value: float, digits: int = 6) -> float | None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return round(float(value), digits)


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    """mean, p50, p90, p99 and max of a 1-D array (None when empty)."""
    if len(values) == 0:
        return {k: None for k in ("mean", "p50", "p90", "p99", "max")}
    return {
        "mean": _round(values.mean()),
        "p50": _round(np.percentile(values, 50)),
        "p90": _round(np.percentile(values, 90)),
        "p99": _round(np.percentile(values, 99)),
        "max": _round(values.max()),
    }


MEMORY_SUMMARY_KEYS = (
    "token_states_pct", "reserved_pct", "internal_fragmentation_pct", "internal_over_reservation_pct",
    "internal_rounding_pct", "internal_page_padding_pct", "external_fragmentation_pct", "idle_pct", "block_level_usage_pct",
    "token_level_usage_pct", "mean_logical_tokens", "sharing_savings_pct",
    "mean_largest_free_extent_slots", "peak_token_states_slots")


def memory_summary(steps: pd.DataFrame, capacity_slots: int) -> dict:
    """Step-duration-weighted memory breakdown in percent (sums to 100) and in slots.

    A system that ran no step (it rejected every request) measured nothing: every figure
    is None, not 0 (which would read as a pool that is all waste, or all idle).
    """
    if not len(steps):
        return {"capacity_slots": capacity_slots, **dict.fromkeys(MEMORY_SUMMARY_KEYS),
                "mean_slots": None}
    weights = steps["duration_s"].to_numpy(dtype=float)
    total = weights.sum()
    if total <= 0:
        weights = np.ones(len(steps))
        total = float(len(steps)) or 1.0

    def avg(column: str) -> float:
        return float((steps[column].to_numpy(dtype=float) * weights).sum() / total)

    slots = {c: avg(c) for c in MEMORY_CATEGORIES}
    pct = {c: 100.0 * v / capacity_slots for c, v in slots.items()}
    logical = avg("logical_tokens")
    physical_tokens = slots["token_states"]
    out = {
        "capacity_slots": capacity_slots,
        "token_states_pct": _round(pct["token_states"], 4),
        "reserved_pct": _round(pct["reserved"], 4),
        "internal_fragmentation_pct": _round(sum(pct[c] for c in INTERNAL_CATEGORIES), 4),
        "internal_over_reservation_pct": _round(pct["internal_over_reservation"], 4),
        "internal_rounding_pct": _round(pct["internal_rounding"], 4),
        "internal_page_padding_pct": _round(pct["internal_page_padding"], 4),
        "external_fragmentation_pct": _round(pct["external_fragmentation"], 4),
        "idle_pct": _round(pct["idle"], 4),
        "mean_slots": {c: _round(v, 3) for c, v in slots.items()},
        "block_level_usage_pct": _round(100.0 * avg("allocated_slots") / capacity_slots, 4),
        "token_level_usage_pct": _round(pct["token_states"], 4),
        "mean_logical_tokens": _round(logical, 3),
        "sharing_savings_pct": _round(100.0 * (1.0 - physical_tokens / logical) if logical > 0 else 0.0, 4),
        "mean_largest_free_extent_slots": _round(avg("largest_free_extent"), 3),
        "peak_token_states_slots": int(steps["token_states"].max()) if len(steps) else 0,
    }
    return out


def layer_group_summary(report: dict, steps: pd.DataFrame) -> dict:
    """A layer-group manager's report (``LayerGroupReport.layer_group_report``) with each
    kind's step-duration-weighted mean of the blocks it held (None without steps)."""
    weights = steps["duration_s"].to_numpy(dtype=float) if len(steps) else np.zeros(0)
    if weights.sum() <= 0:
        weights = np.ones(len(steps))
    kinds = []
    for i, kind in enumerate(report["kinds"]):
        column = f"layer_group{i}_blocks"
        mean = (float((steps[column].to_numpy(dtype=float) * weights).sum() / weights.sum())
                if len(steps) and column in steps else None)
        kinds.append({**kind, "mean_blocks": _round(mean, 3)})
    return {**report, "kinds": kinds}


def serving_summary(steps: pd.DataFrame, requests: pd.DataFrame) -> dict:
    """Throughput, latency percentiles and batch sizes."""
    done = requests[requests["status"] == "finished"]
    makespan = float(done["finish_s"].max()) if len(done) else 0.0
    out_tokens = float((done["output_len"] * done["num_seqs"]).sum())
    prompt_tokens = float(done["prompt_len"].sum())
    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy(dtype=float)
    e2e = (done["finish_s"] - done["arrival_s"]).to_numpy(dtype=float)
    multi = done["output_len"] > 1
    tpot = ((done["finish_s"] - done["first_token_s"])[multi]
            / (done["output_len"][multi] - 1)).to_numpy(dtype=float)
    normalized = e2e / done["output_len"].to_numpy(dtype=float) if len(done) else np.array([])
    weights = steps["duration_s"].to_numpy(dtype=float)
    batch = steps["num_seqs"].to_numpy(dtype=float)
    mean_batch = float((batch * weights).sum() / weights.sum()) if weights.sum() > 0 else 0.0
    phases = [c for c in steps.columns if c not in STEP_COLUMNS and c.endswith("_s")]
    by_phase = ({"time_by_phase_s": {c[:-2]: _round(float(steps[c].sum())) for c in phases}}
                if phases else {})
    return {
        **by_phase,
        "requests": {
            "finished": int(len(done)),
            "rejected": int((requests["status"] == "rejected").sum()),
            "unfinished": int((requests["status"] == "unfinished").sum()),
        },
        "throughput": {
            "makespan_s": _round(makespan),
            "requests_per_s": _round(len(done) / makespan if makespan > 0 else 0.0),
            "output_tokens_per_s": _round(out_tokens / makespan if makespan > 0 else 0.0),
            "total_tokens_per_s": _round((out_tokens + prompt_tokens) / makespan if makespan > 0 else 0.0),
        },
        "latency": {
            "ttft_s": percentiles(ttft),
            "tpot_s": percentiles(tpot),
            "e2e_s": percentiles(e2e),
            "normalized_s_per_token": percentiles(normalized),
        },
        "batch": {
            "mean_seqs": _round(mean_batch, 4),
            "max_seqs": int(batch.max()) if len(batch) else 0,
            "mean_batched_tokens": _round(
                float((steps["num_batched_tokens"].to_numpy(float) * weights).sum() / weights.sum())
                if weights.sum() > 0 else 0.0, 4),
        },
        "steps": int(len(steps)),
        "simulated_time_s": _round(float(steps["time_s"].iloc[-1] + steps["duration_s"].iloc[-1])
                                   if len(steps) else 0.0),
    }
