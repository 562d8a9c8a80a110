"""The run's step and request tables and their CSV files (harness.metrics.summaries,
harness.run.results): the fast conversions give what the general ones give, exactly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.metrics.summaries import REQUEST_COLUMNS, RunRecorder, _column, _float_column
from harness.run.results import write_table

BIG = 2 ** 63


@pytest.mark.parametrize("values", [
    [0, 1, 2, 10 ** 12, -5],            # the step table's counts: one pass
    [3, 1.5, 2],                        # a float among ints: float64
    [3, 2.0],                           # an integral float too
    [True, False, True],                # bools: numpy's bool dtype
    [1, True, 0],                       # a bool after an int: int64
    [np.int64(4), 5],                   # numpy ints
    [5, np.int64(4)],
    [np.int32(4), np.int32(5)],         # int32 stays int32
    [1, BIG],                           # past int64
    [1, None],                          # None: object
    [],                                 # empty: float64
    [0.0, 0.5, 2, True, -0.0, float("nan")],  # the times: float64 (ints and a bool too)
    [0.5, 10 ** 400],                   # an int past a double: object
    [0.5, None], [0.5, "x"],            # object, a string dtype
    [0.5, np.float32(0.1)],
])
def test_a_step_column_is_what_np_asarray_makes_of_it(values):
    fast, general = _column(values), np.asarray(values)
    assert fast.dtype == general.dtype
    if fast.dtype.kind in "if":  # bit for bit: -0.0 and NaN too
        assert fast.tobytes() == general.tobytes()
    else:
        assert fast.tolist() == general.tolist()


@pytest.mark.parametrize("values", [
    [0.1, 0.0, -0.0, 1e-300, 5e-324, 1e308, float("inf"), float("nan")],
    [1, 2.5, 2 ** 53 + 1, True],        # ints and a bool become floats (rounded alike)
    [np.float64(0.25), np.float32(0.1)],
    [0.5, None],                        # None: NaN
    ["0.5", 1.0],                       # numpy parses a string
    [0.5, 10 ** 400],                   # past a double: an OverflowError either way
    [],
    np.array([0.5, 1.5]),               # already an array
])
def test_a_phase_column_is_what_np_asarray_as_float_makes_of_it(values):
    try:
        general = np.asarray(values, dtype=float)
    except OverflowError:  # numpy refuses it: so does the fast way
        with pytest.raises(OverflowError):
            _float_column(values)
        return
    fast = _float_column(values)
    assert fast.dtype == general.dtype
    assert fast.tobytes() == general.tobytes()  # bit for bit: -0.0 and NaN too


EDGE_FLOATS = [0.0, -0.0, 1.0, -1.5, 0.1, 1 / 3, 2 / 3 * 1e-7, 1e-6, 9.999999e-7, 1.5e-7,
               123456789.125, 1e15, 1e16, 1.2345678901234567e20, 1e21, 1e22, 5e-324,
               2.2250738585072014e-308, 1.7976931348623157e308, float("inf"), float("-inf"),
               float("nan"), 2 ** 53, 2 ** 53 + 2.0, 0.054036794190934885,
               7.0308974987739085e-06]


def old_write_table_bytes(frame: pd.DataFrame) -> bytes:
    """How write_table made its bytes before it streamed: a whole CSV in memory."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    sink = pa.BufferOutputStream()
    pa_csv.write_csv(pa.Table.from_pandas(frame, preserve_index=False), sink)
    return sink.getvalue().to_pybytes()


def test_a_streamed_table_is_the_bytes_of_the_whole_table_written_at_once(tmp_path):
    rows = 5000  # several of pyarrow's batches
    floats = np.resize(np.array(EDGE_FLOATS), rows)
    frame = pd.DataFrame({
        "step": np.arange(rows), "time_s": floats, "duration_s": floats[::-1].copy(),
        "name": [f'r"{i},\n' if i % 7 == 0 else f"r{i}" for i in range(rows)],
        "first_token_s": np.where(np.arange(rows) % 5 == 0, np.nan, 0.5),
        "status": "finished"})
    write_table(tmp_path / "t.csv", frame)
    assert (tmp_path / "t.csv").read_bytes() == old_write_table_bytes(frame)
    empty = frame.iloc[:0]
    write_table(tmp_path / "empty.csv", empty)
    assert (tmp_path / "empty.csv").read_bytes() == old_write_table_bytes(empty)


def _request_rows(count: int, seed: int) -> list[tuple]:
    """Request rows as the engine records them (``_request_row``), in finishing order:
    finished, rejected (no token times) and unfinished (no finish time) requests."""
    rng = np.random.default_rng(seed)
    rows = []
    for request_id in rng.permutation(count).tolist():
        arrival = float(rng.random() * 100)
        status = ("finished", "rejected", "unfinished")[int(rng.integers(0, 3))]
        first = None if status == "rejected" else arrival + float(rng.random())
        finish = first + 1.5 if status == "finished" else None
        rows.append((request_id, f"trace.csv:{request_id + 2}", arrival, first, finish,
                     int(rng.integers(1, 4000)), int(rng.integers(1, 500)), 1,
                     int(rng.integers(0, 64)) * 16, int(rng.integers(0, 3)), 0, status))
    return rows


@pytest.mark.parametrize("rows", [
    _request_rows(3000, seed=0),
    [row for row in _request_rows(500, seed=1) if row[-1] == "finished"],  # floats only
    [row for row in _request_rows(500, seed=2) if row[-1] == "rejected"],  # no token times
    sorted(_request_rows(50, seed=3), key=lambda row: row[3] is not None),  # None leads
    [(0, "a", 0, 1, 2.5, 3, 4, 1, 0, 0, 0, "finished"),  # int times, then floats
     (1, "b", 0.5, 1.5, 3, 3, 4, 2, 0, 0, 0, "finished")],
    [],
])
def test_a_request_table_is_what_pandas_makes_of_its_rows(rows, tmp_path):
    recorder = RunRecorder(capacity_slots=1024)
    for row in rows:
        recorder.record_request(row)
    fast = recorder.request_table()
    general = pd.DataFrame(rows, columns=list(REQUEST_COLUMNS)).sort_values(
        "request_id", kind="stable").reset_index(drop=True)  # pandas reads the rows
    pd.testing.assert_frame_equal(fast, general, check_exact=True)
    write_table(tmp_path / "fast.csv", fast)
    write_table(tmp_path / "general.csv", general)
    assert (tmp_path / "fast.csv").read_bytes() == (tmp_path / "general.csv").read_bytes()
