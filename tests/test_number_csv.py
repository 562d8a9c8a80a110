"""A table of numbers written by runs (harness.run.number_csv, the step tables' CSVs) is
byte for byte what pyarrow's CSV writer makes of the whole table."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest

from harness.run import number_csv
from harness.run.results import write_table

EDGE_FLOATS = [0.0, -0.0, 1.0, -1.5, 0.1, 1 / 3, 1e-6, 9.999999e-7, 1.5e-7, 123456789.125,
               1e15, 1e16, 1e21, 1e22, 5e-324, 1.7976931348623157e308, float("inf"),
               float("-inf"), 2 ** 53 + 2.0, 0.054036794190934885, 7.0308974987739085e-06]


def pyarrow_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pa_csv.write_csv(table, sink)
    return sink.getvalue()


def by_runs_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    number_csv.write_number_csv(table, sink)
    return sink.getvalue()


def runs_of(rng: np.random.Generator, values: list, rows: int, mean_run: float) -> np.ndarray:
    """``rows`` values drawn from ``values`` in runs of about ``mean_run`` rows."""
    lengths = rng.geometric(1 / mean_run, size=rows)
    return np.resize(np.repeat(rng.choice(np.array(values, dtype=object), len(lengths)),
                               lengths), rows)


@pytest.mark.parametrize("rows", [0, 1, 2, 7, number_csv.ROWS_PER_BATCH + 3])
@pytest.mark.parametrize("mean_run", [1.0, 1.8, 2.5, 40.0])
def test_a_number_table_is_written_as_pyarrow_writes_it(monkeypatch, rows, mean_run):
    monkeypatch.setattr(number_csv, "ROWS_PER_BATCH", 5000)  # several batches
    rng = np.random.default_rng(rows + int(10 * mean_run))
    frame = pd.DataFrame({
        "step": np.arange(rows),
        "count": runs_of(rng, [0, 1, -7, 2 ** 62, 12345], rows, mean_run).astype(np.int64),
        "time_s": rng.random(rows).cumsum(),
        "edge_s": runs_of(rng, EDGE_FLOATS, rows, mean_run).astype(np.float64),
        # zeros of either sign side by side: equal values, different texts ("0", "-0")
        "zero_s": runs_of(rng, [0.0, -0.0], rows, mean_run).astype(np.float64),
        "small": runs_of(rng, [3, 4], rows, mean_run).astype(np.int32),
        "single": runs_of(rng, [0.1, 2.5], rows, mean_run).astype(np.float32),
        "nan_s": runs_of(rng, [0.5, float("nan")], rows, mean_run).astype(np.float64),  # null
        'a "quoted", name': np.ones(rows, dtype=np.uint8),
    })
    table = pa.Table.from_pandas(frame, preserve_index=False)
    assert number_csv.is_number_table(table)
    assert by_runs_bytes(table) == pyarrow_bytes(table)
    chunked = pa.concat_tables([table.slice(0, rows // 3), table.slice(rows // 3)])
    assert by_runs_bytes(chunked) == pyarrow_bytes(table)


def test_a_column_of_long_runs_is_cast_a_run_at_a_time():
    array = pa.array([0.5] * 10 + [-0.0] * 5 + [0.0] * 5)
    texts = number_csv._texts_by_runs(array)
    assert texts.values.to_pylist() == ["0.5", "-0", "0"]  # each run's text once
    assert texts.run_ends.to_pylist() == [10, 15, 20]
    assert texts.to_pylist() == ["0.5"] * 10 + ["-0"] * 5 + ["0"] * 5
    distinct = pa.array([0.5, 1.5, 2.5, 2.5])  # most values start a run: left to the writer
    assert number_csv._texts_by_runs(distinct) is distinct


def test_write_table_writes_other_tables_as_pyarrow_does(tmp_path):
    frame = pd.DataFrame({"request_id": [2, 1], "name": ['a"b,', None],
                          "first_token_s": [0.5, np.nan], "ok": [True, False]})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    assert not number_csv.is_number_table(table)
    assert not number_csv.is_number_table(pa.table({}))
    write_table(tmp_path / "t.csv", frame)
    assert (tmp_path / "t.csv").read_bytes() == pyarrow_bytes(table)
    steps = pd.DataFrame({"step": np.arange(3), "time_s": [0.0, 0.5, 0.5]})
    write_table(tmp_path / "s.csv", steps)
    assert (tmp_path / "s.csv").read_bytes() == pyarrow_bytes(pa.Table.from_pandas(steps))
