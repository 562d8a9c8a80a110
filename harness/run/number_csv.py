"""A table of numbers as CSV, byte for byte what pyarrow's CSV writer makes of it, in
less CPU time: the run's step tables (10^5-10^6 rows, 20-30 columns).

pyarrow's writer casts every value to a string (a double to its shortest round-trip form:
about 70 ns a value, an integer about 15 ns) before it lays the texts out as lines. Most
of a step table's counts and ``<phase>_s`` columns keep one value for many steps in a row
(a fast-forwarded span's): such a column is cast a run at a time, by pyarrow's own cast,
and its texts repeated over their runs (``_texts_by_runs``: run-end encoded, decoded a
batch at a time) before the writer lays it out.
"""

from __future__ import annotations

from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

# rows prepared and written at a time: a batch's texts stay small enough to be reused by
# pyarrow's allocator (whole columns at once cost page faults, as much as they saved)
ROWS_PER_BATCH = 1 << 14


def is_number_table(table: pa.Table) -> bool:
    """Whether ``table`` has columns, all of integers or floats (``write_number_csv``)."""
    return table.num_columns > 0 and all(pa.types.is_integer(t) or pa.types.is_floating(t)
                                         for t in table.schema.types)


def write_number_csv(table: pa.Table, handle: BinaryIO) -> None:
    """Write ``table`` (integers and floats: ``is_number_table``) to ``handle`` exactly as
    ``pyarrow.csv.write_csv(table, handle)`` does."""
    # NOTE: numbers are never quoted, so quoting "none" writes them as the default
    # ("needed") does, and leaves the texts of the columns cast ahead unquoted too
    # (the header's names are quoted either way)
    header = pa_csv.WriteOptions(quoting_style="none")
    rows = pa_csv.WriteOptions(quoting_style="none", include_header=False)
    table = table.combine_chunks()
    if not table.num_rows:
        pa_csv.write_csv(table, handle, write_options=header)
    columns = [_texts_by_runs(column.chunk(0)) for column in table.columns]
    for start in range(0, table.num_rows, ROWS_PER_BATCH):
        batch = pa.table([_batch_of(column, start) for column in columns],
                         names=table.column_names)
        pa_csv.write_csv(batch, handle, write_options=header if start == 0 else rows)


def _texts_by_runs(array: pa.Array) -> pa.Array:
    """``array`` (numbers) cast to strings a run of equal values at a time when at most
    half its values start a run (equal bits: -0.0 and 0.0, written "-0" and "0", never
    share one), run-end encoded (each run's text once); else ``array`` itself, for the
    writer to cast."""
    if array.null_count or len(array) < 2:
        return array
    values = array.to_numpy()  # [rows]
    bits = values.view(f"i{values.dtype.itemsize}")
    starts = np.empty(len(values), dtype=bool)  # [rows]: a run starts there
    starts[0] = True
    np.not_equal(bits[1:], bits[:-1], out=starts[1:])
    if 2 * np.count_nonzero(starts) > len(values):
        return array
    firsts = np.flatnonzero(starts)  # [runs]: each run's first row
    ends = np.empty(len(firsts), dtype=np.int32)  # [runs]: the row after each run
    ends[:-1] = firsts[1:]
    ends[-1] = len(values)
    texts = pc.cast(pa.array(values[firsts]), pa.string())  # [runs]
    return pa.RunEndEncodedArray.from_arrays(pa.array(ends), texts)


def _batch_of(column: pa.Array, start: int) -> pa.Array:
    """The ``ROWS_PER_BATCH`` rows of ``column`` (``_texts_by_runs``'s) from ``start``, as
    the writer takes them (it does not read run-end encoded arrays: their texts decoded,
    a batch at a time)."""
    batch = column.slice(start, ROWS_PER_BATCH)
    return pc.run_end_decode(batch) if pa.types.is_run_end_encoded(batch.type) else batch
