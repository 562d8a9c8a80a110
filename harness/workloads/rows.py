"""Typed columns from raw trace values, with row-level validation.

``RowParser`` converts raw columns (``tables.Table``) to numpy arrays and
remembers every malformed value: missing, not an integer, negative or zero
length, a timestamp out of order. ``resolve`` then either raises an
``InputError`` for the first malformed row (file, line, field) or, with
``on_error=skip``, drops the malformed rows and counts them by reason.
"""

from __future__ import annotations

import math
import warnings
from bisect import bisect_right
from typing import Any

import numpy as np

from harness.errors import InputError
from harness.workloads.registry import Tally
from harness.workloads.tables import Table

TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_INT_LIMIT = 1 << 53


MAX_DETAIL = 200  # characters of a malformed value shown in an error line


class _Bad(Exception):
    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(kind)
        self.kind, self.detail = kind, detail


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def parse_int(value: Any) -> int:
    """An integer from a CSV string or JSON value; integral floats ('12.0') are accepted."""
    if _is_missing(value):
        raise _Bad("missing")
    if isinstance(value, (bool, np.bool_)):
        raise _Bad("not an integer", repr(value))
    if isinstance(value, (int, np.integer)):
        number = int(value)
    elif isinstance(value, (float, np.floating)):
        if not (math.isfinite(value) and float(value).is_integer()):
            raise _Bad("not an integer", repr(value))
        number = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if not text.isascii() or "_" in text:  # int() would take "3_96" and other digits
            raise _Bad("not an integer", repr(value))
        try:
            number = int(text)
        except ValueError:
            try:
                as_float = float(text)
            except ValueError:
                raise _Bad("not an integer", repr(value)) from None
            if not (math.isfinite(as_float) and as_float.is_integer()):
                raise _Bad("not an integer", repr(value)) from None
            number = int(as_float)
    else:
        raise _Bad("not an integer", repr(value))
    if abs(number) >= _INT_LIMIT:
        raise _Bad("out of range", repr(value))
    return number


def parse_float(value: Any) -> float:
    if _is_missing(value):
        raise _Bad("missing")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, str, np.integer, np.floating)):
        raise _Bad("not a number", repr(value))
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise _Bad("not a number", repr(value)) from None
    if not math.isfinite(number):
        raise _Bad("not a number", repr(value))
    return number


# NOTE: numpy reads a UTC offset ("...+01:00", "...Z") by converting to UTC, which is what a
# trace's arrival times need, and warns that it is deprecated: the warning is not the
# user's business.
_TIMEZONE_WARNING = "no explicit representation of timezones"


# NOTE: numpy wraps a date-time outside datetime64[ns]'s range around without a word (year
# 0 reads as 1753): dates are read in microseconds (a range of 290,000 years) first.
_NS_RANGE = (np.datetime64("1678-01-01", "us"), np.datetime64("2262-04-11", "us"))
_OUT_OF_RANGE = "date-time out of range (years 1678 to 2262)"


def _as_datetimes(values: Any, unit: str) -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _TIMEZONE_WARNING, UserWarning)
        if isinstance(values, np.ndarray):
            return values.astype(f"datetime64[{unit}]")
        return np.datetime64(values, unit)


def _in_ns_range(wide: Any) -> Any:
    return (wide >= _NS_RANGE[0]) & (wide < _NS_RANGE[1])


def parse_datetime(value: Any) -> np.datetime64:
    if _is_missing(value):
        raise _Bad("missing")
    if isinstance(value, (bool, int, float, np.number)) or isinstance(value, (list, dict)):
        raise _Bad("not a date-time", repr(value))
    try:
        wide = _as_datetimes(value, "us")
        if np.isnat(wide):
            raise _Bad("missing", repr(value))
        if not _in_ns_range(wide):
            raise _Bad(_OUT_OF_RANGE, repr(value))
        return _as_datetimes(value, "ns")
    except (ValueError, TypeError, OverflowError):
        raise _Bad("not a date-time", repr(value)) from None


class RowParser:
    """Typed columns of one table plus the errors found in them."""

    def __init__(self, table: Table, on_error: str) -> None:
        self.table = table
        self.on_error = on_error
        self.errors: dict[int, tuple[str | None, str, str]] = dict(table.errors)
        self.num_rows = len(table)
        self.fixes: dict[str, str] = {}  # column -> the fix of its errors, when it is not the row

    def error(self, row: int, field: str | None, kind: str, detail: str = "") -> None:
        """Record a malformed value; the first one per row wins. A long detail is cut (a
        4,575-character value would fill the error line)."""
        if len(detail) > MAX_DETAIL:
            detail = f"{detail[:MAX_DETAIL - 20]}... ({len(detail):,} characters)"
        self.errors.setdefault(int(row), (field, kind, detail))

    def _convert(self, column: str, parse, dtype, fill) -> np.ndarray:
        values = self.table.columns[column]
        out = np.full(self.num_rows, fill, dtype=dtype)
        for row, value in enumerate(values):
            if row in self.errors and self.errors[row][0] is None:
                continue  # the whole record is bad
            try:
                out[row] = parse(value)
            except _Bad as bad:
                self.error(row, column, bad.kind, bad.detail)
        return out

    def ints(self, column: str, min_value: int | None = 1) -> np.ndarray:
        """Column as int64; values below ``min_value`` are errors (lengths must be >= 1)."""
        values = self.table.columns[column]
        out = None
        if all(type(v) is int or (type(v) is str and v.isascii() and "_" not in v)
               for v in values):
            try:  # fast path: every value parses with int() and is in range
                out = np.array([int(v) for v in values], dtype=np.int64)
                if ((out >= _INT_LIMIT) | (out <= -_INT_LIMIT)).any():
                    out = None  # the row-by-row path names each one
            except (ValueError, OverflowError):
                out = None
        if out is None:
            out = self._convert(column, parse_int, np.int64, 0)
        if min_value is not None:
            for row in np.flatnonzero(out < min_value).tolist():
                kind = "negative or zero length" if min_value == 1 else f"below {min_value}"
                self.error(row, column, kind, f"got {out[row]}")
        return out

    def strings(self, column: str) -> list[str]:
        values = self.table.columns[column]
        result = []
        for row, value in enumerate(values):
            if value is None:
                self.error(row, column, "missing")
            result.append("" if value is None else str(value))
        return result

    def times(self, column: str, unit: str) -> np.ndarray:
        """Column as float64 seconds: numbers in ``unit`` (s|ms|us|ns) or date-times ('datetime')."""
        values = self.table.columns[column]
        if unit != "datetime":
            out = self._convert(column, parse_float, np.float64, np.nan) * TIME_UNITS[unit]
            bad = [row for row, error in self.errors.items() if error[0] == column]
            if bad and _is_datetime(values[min(bad)]):
                self.fixes[column] = ("the column holds date-times: set "
                                      "workload.timestamp_unit=datetime")
            return out
        stamps = None
        if all(type(v) is str for v in values):
            try:
                text = np.array(values)
                if _in_ns_range(_as_datetimes(text, "us")).all():  # (False for NaT)
                    stamps = _as_datetimes(text, "ns")
            except (ValueError, TypeError, OverflowError):
                stamps = None
        if stamps is None:
            stamps = self._convert(column, parse_datetime, "datetime64[ns]", np.datetime64("NaT", "ns"))
        good = ~np.isnat(stamps)
        if not good.any():
            return np.full(self.num_rows, np.nan)
        ns = stamps.view(np.int64)  # [num_rows]; NaT rows are not read
        origin = int(ns[good][0])
        if int(ns[good].max()) - origin < 2**63 and int(ns[good].min()) - origin >= -2**63:
            seconds = (ns - origin) / 1e9
        else:  # more than 292 years apart: int64 nanoseconds overflow (exact in Python ints)
            seconds = np.array([(int(v) - origin) / 1e9 for v in ns])
        return np.where(good, seconds, np.nan)

    def check_monotonic(self, column: str, seconds: np.ndarray) -> None:
        """The fewest good rows whose timestamps put the others out of order are errors.

        The rows kept are a longest run of non-decreasing timestamps (the earliest rows
        where several runs are as long), so one mistyped time (a jump ahead, a step back)
        costs its own row, not every row after it. A row left out either goes back
        before the kept row above it or jumps ahead of the kept row below it.
        """
        good = np.ones(self.num_rows, dtype=bool)
        if self.errors:
            good[list(self.errors)] = False
        rows = np.flatnonzero(good)
        t = seconds[rows]  # [len(rows)]
        if t.size < 2 or not (t[1:] < t[:-1]).any():
            return
        kept = _longest_ordered_run(t.tolist())
        raw, lines = self.table.columns[column], self.table.lines
        position = 0  # kept[position] is the first kept row after the current one
        for i in range(t.size):
            if position < len(kept) and kept[position] == i:
                position += 1
                continue
            row = int(rows[i])
            if position and t[i] < t[kept[position - 1]]:
                above = int(rows[kept[position - 1]])
                self.error(row, column, "timestamp goes backwards",
                           f"{raw[row]!r} is earlier than line {lines[above]}'s {raw[above]!r}")
            else:
                below = int(rows[kept[position]])
                self.error(row, column, "timestamp jumps ahead",
                           f"{raw[row]!r} is later than line {lines[below]}'s {raw[below]!r}, the "
                           "next row in order")

    def resolve(self, tally: Tally) -> np.ndarray:
        """Raise for the first malformed row, or (on_error=skip) count and mask them out."""
        tally.rows_read += self.num_rows
        keep = np.ones(self.num_rows, dtype=bool)
        if not self.errors:
            return keep
        if self.on_error == "raise":
            row = min(self.errors)
            field, kind, detail = self.errors[row]
            fix = self.fixes.get(field) or ("fix the row, or set workload.on_error=skip to skip "
                                            "malformed rows and count them")
            raise InputError(f"{kind}{': ' + detail if detail else ''} ({fix})",
                             path=self.table.path, line=self.table.lines[row], field=field)
        for row, (field, kind, _) in self.errors.items():
            tally.skipped[f"{field}: {kind}" if field else kind] += 1
        keep[list(self.errors)] = False
        return keep


def _is_datetime(value: Any) -> bool:
    """Whether ``value`` reads as a date-time (``timestamp_unit=datetime`` would take it)."""
    try:
        parse_datetime(value)
    except _Bad:
        return False
    return True


def _longest_ordered_run(times: list[float]) -> list[int]:
    """Indices of a longest non-decreasing subsequence of ``times``: of all of them, the one
    that keeps the earliest indices (compared index by index). O(n log n)."""
    # longest[i]: the longest non-decreasing run starting at i (patience sorting from the right)
    longest = [0] * len(times)
    tails: list[float] = []  # tails[k]: minus the latest time starting an ordered run of k + 1
    for i in range(len(times) - 1, -1, -1):
        value = -times[i]  # a run read backwards does not increase: negated, it does not decrease
        k = bisect_right(tails, value)
        if k == len(tails):
            tails.append(value)
        else:
            tails[k] = value
        longest[i] = k + 1
    need = len(tails)
    kept: list[int] = []
    for i, value in enumerate(times):  # greedy: the first row that still completes a longest run
        if longest[i] == need and (not kept or value >= times[kept[-1]]):
            kept.append(i)
            need -= 1
            if not need:
                break
    return kept
