"""A fast-forwarded span recorded as one record gives the step table that recording its
rows one by one gives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.metrics.summaries import STEP_COLUMNS, RunRecorder


def _span_value(rng: np.random.Generator, name: str, span: int, kind: str):
    """One column's value for a span of ``span`` steps, of the given kind."""
    floats = name in ("time_s", "duration_s")
    if kind == "number":
        return float(rng.random()) if floats else int(rng.integers(0, 1000))
    if kind == "range" and not floats:
        start, stride = int(rng.integers(0, 1000)), int(rng.integers(-5, 6)) or 1
        return range(start, start + stride * span, stride)
    return [float(x) for x in rng.random(span)] if floats else \
        [int(x) for x in rng.integers(0, 1000, span)]


def _row(columns: dict) -> tuple:
    """``record_span``'s row: the values of ``columns`` in ``STEP_COLUMNS`` order."""
    return tuple(columns[name] for name in STEP_COLUMNS[1:])


def _expand(value, span: int) -> list:
    return list(value) if isinstance(value, (list, range)) else [value] * span


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("kinds", [("number",), ("range",), ("list",), ("number", "range", "list")])
def test_span_records_lay_the_rows_that_single_rows_give(seed, kinds):
    rng = np.random.default_rng(seed)
    compact, rows = RunRecorder(capacity_slots=1), RunRecorder(capacity_slots=1)
    kind_of = {name: kinds[int(rng.integers(len(kinds)))] for name in STEP_COLUMNS[1:]}
    for _ in range(int(rng.integers(1, 40))):
        if rng.random() < 0.4:  # a row recorded by itself: into both recorders
            row = {name: _span_value(rng, name, 1, "number") for name in STEP_COLUMNS[1:]}
            for recorder in (compact, rows):
                recorder.steps["step"].append(len(recorder.steps["step"]))
                for name, value in row.items():
                    recorder.steps[name].append(value)
            continue
        span = int(rng.integers(1, 20))
        # (a column may change kind from one span to the next, as num_waiting does)
        columns = {name: _span_value(rng, name, span, kind_of[name] if rng.random() < 0.8
                                     else kinds[0]) for name in STEP_COLUMNS[1:]}
        compact.record_span(span, _row(columns))
        first = len(rows.steps["step"])
        rows.steps["step"].extend(range(first, first + span))
        for name, value in columns.items():
            rows.steps[name].extend(_expand(value, span))
    assert not rows.spans
    pd.testing.assert_frame_equal(compact.step_table(), rows.step_table(), check_exact=True)


def test_a_run_of_spans_alone_keeps_each_columns_dtype():
    compact, rows = RunRecorder(capacity_slots=1), RunRecorder(capacity_slots=1)
    columns = {name: 0.5 if name in ("time_s", "duration_s") else 3 for name in STEP_COLUMNS[1:]}
    compact.record_span(4, _row(columns))
    rows.steps["step"].extend(range(4))
    for name, value in columns.items():
        rows.steps[name].extend([value] * 4)
    table = compact.step_table()
    pd.testing.assert_frame_equal(table, rows.step_table(), check_exact=True)
    assert table["num_seqs"].dtype == np.int64 and table["time_s"].dtype == np.float64


@pytest.mark.parametrize("span_value", [2.5, 7, [1.5, 2.5, 3.5]])
def test_single_rows_and_spans_of_other_kinds_promote_as_one_list_does(span_value):
    """Single rows of ints with spans of floats (or ints) among them: the column's dtype and
    values are those of all its values in one list."""
    compact, rows = RunRecorder(capacity_slots=1), RunRecorder(capacity_slots=1)
    for block in range(3):
        for recorder in (compact, rows):  # two single rows
            for _ in range(2):
                recorder.steps["step"].append(len(recorder.steps["step"]))
                for name in STEP_COLUMNS[1:]:
                    recorder.steps[name].append(block)
        columns = {name: span_value for name in STEP_COLUMNS[1:]}
        compact.record_span(3, _row(columns))
        first = len(rows.steps["step"])
        rows.steps["step"].extend(range(first, first + 3))
        for name in STEP_COLUMNS[1:]:
            rows.steps[name].extend(_expand(span_value, 3))
    table = compact.step_table()
    pd.testing.assert_frame_equal(table, rows.step_table(), check_exact=True)
    assert table["num_seqs"].dtype == (np.int64 if span_value == 7 else np.float64)
