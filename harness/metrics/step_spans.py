"""Fast-forwarded spans' step rows, kept as one record per span while the engine runs and
laid into the step table's columns in bulk when the table is built.

A span of K steady decode steps has K rows whose figures are mostly constant or move by
a fixed amount per step (``harness.engine.fast_forward``). Extending the recorder's column
lists by K values each (18 columns) was about a sixth of a contiguous system's
fast-forward time on the Azure conv replay (spans of ~16 steps); as one number or range
per column and span, each column is filled at table time at once with numpy (a repeat or
a ramp). A column given as a list (the clock, a paged span's block figures) is extended
right away, while its values are in the CPU's cache: laid later, it cost more (step_table
+0.03 s on Azure conv max, +0.07 s on paged, 2026-12-05). A span's other values are kept
in one list, as the row its caller built: a list per column took 18 appends per span
(Azure conv max: 1% fewer instructions, 2026-12-05).
"""

from __future__ import annotations

from itertools import compress
from typing import Callable

import numpy as np


class StepSpans:
    """The rows of fast-forwarded spans: for each span its first row, its steps, and its
    value of each step column (all but ``step``): a number (every step's), a range of the
    span's values, or None when they were a list (in the column's ``listed`` values)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.firsts: list[int] = []  # [spans] the row of each one's first step
        self.sizes: list[int] = []  # [spans] steps
        # [spans * columns] each one's values in ``names`` order, span after span (a flat
        # list: a column is a strided slice of it)
        self.values: list = []
        # [columns] each column's values given as lists, span after span
        self.listed: list[list] = [[] for _ in names]

    def __len__(self) -> int:
        return len(self.sizes)

    def add(self, first: int, span: int, row: tuple) -> None:
        """A span of ``span`` steps from row ``first``; ``row``: each column's value in
        ``names`` order, a number (every step's), or a range or a list of ``span`` values."""
        self.firsts.append(first)
        self.sizes.append(span)
        # NOTE: a list's values go to its column's listed values; ``extend`` gives None,
        # the row's value for them
        listed = self.listed
        self.values += [listed[index].extend(value) if type(value) is list else value
                        for index, value in enumerate(row)]

    def merge(self, columns: dict[str, np.ndarray], convert: Callable[[list], np.ndarray]
              ) -> dict[str, np.ndarray]:
        """The step table's columns: ``columns`` holds every row's ``step`` and, for each
        other column, the values of the rows recorded one by one, in row order (the rows
        outside the spans); the spans' rows are laid in between. ``convert``: a list of
        Python numbers to its array (the recorder's own conversion, so that a column's
        dtype is the one a list of all its values gives)."""
        steps = len(columns["step"])
        lengths = np.array(self.sizes, dtype=np.int64)  # [spans]
        total = int(lengths.sum())
        within, span_rows, single = span_layout(self.firsts, lengths, steps)
        # NOTE: a column is gathered from its single rows' values and its spans' (scattering
        # the two into an empty column cost twice as much), and a column of one number per
        # span is repeated over runs of rows (a single row, a span's), in row order (about a
        # third of the cost of laying it: the contiguous systems' 285k rows)
        singles = steps - total
        source = np.empty(steps, dtype=np.int64)  # [steps]: each row's place in the two parts
        source[single] = np.arange(singles)
        source[span_rows] = singles + np.arange(total)
        runs = np.argsort(np.concatenate([np.flatnonzero(single),  # [singles + spans]: by row
                                          np.array(self.firsts, dtype=np.int64)]))
        run_lengths = np.concatenate([np.ones(singles, dtype=np.int64), lengths])[runs]
        merged = {"step": columns["step"]}
        width = len(self.names)
        for index, name in enumerate(self.names):
            values = self.values[index::width]  # [spans]
            single_values = columns[name]
            if len(values) != len(lengths) or len(single_values) != singles:
                raise RuntimeError(f"step column {name}: {len(values)} spans of "  # invariant
                                   f"{len(lengths)}, {len(single_values)} single rows of "
                                   f"{singles}")
            kinds = set(map(type, values))
            if not singles:  # every row a span's
                merged[name] = _span_values(values, kinds, self.listed[index], lengths, within,
                                            convert)
            elif not kinds & {range, type(None)}:  # a number per span
                merged[name] = np.repeat(np.concatenate([single_values, convert(values)])[runs],
                                         run_lengths)
            else:
                laid = _span_values(values, kinds, self.listed[index], lengths, within,
                                    convert)  # [total]
                merged[name] = np.concatenate([single_values, laid])[source]
        return merged


def span_layout(firsts: list[int], lengths: np.ndarray, steps: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where spans of ``lengths`` steps from rows ``firsts`` lie among ``steps`` rows:
    (each span step's step within its span, and its row: both [sum(lengths)], span after
    span; [steps] bool: the rows outside the spans, recorded one by one)."""
    offsets = np.cumsum(lengths) - lengths  # [spans]: each span's first among its steps
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(offsets, lengths)
    span_rows = np.repeat(np.array(firsts, dtype=np.int64), lengths) + within
    single = np.ones(steps, dtype=bool)
    single[span_rows] = False
    return within, span_rows, single


def _span_values(values: list, kinds: set[type], listed: list, lengths: np.ndarray,
                 within: np.ndarray, convert: Callable[[list], np.ndarray]) -> np.ndarray:
    """[sum(lengths)]: one column's values over the spans, span after span (``values``: each
    span's, None for a list, ``kinds``: their types, ``listed``: the column's
    ``StepSpans.listed``)."""
    if kinds == {type(None)}:  # all lists
        return convert(listed)
    if kinds == {range}:  # start + step * (its step within the span)
        starts = convert([r.start for r in values])
        strides = convert([r.step for r in values])
        return np.repeat(starts, lengths) + np.repeat(strides, lengths) * within
    if not kinds & {range, type(None)}:  # a number per span: repeated over its steps
        return np.repeat(convert(values), lengths)
    # a mix (a few spans' numbers among lists, say)
    was_list = [value is None for value in values]  # [spans]
    given = list(compress(values, [not x for x in was_list]))  # the others' values
    given_lengths = lengths[~np.array(was_list)]
    if range in kinds:  # their steps' values in Python
        others: list = []
        for value, count in zip(given, given_lengths.tolist()):
            others += value if type(value) is range else [value] * count
        from_others = convert(others)
    else:  # numbers: each repeated over its steps
        from_others = np.repeat(convert(given), given_lengths)
    from_lists = convert(listed)
    in_lists = np.repeat(np.array(was_list), lengths)  # [sum(lengths)]
    # (the dtype of the parts that have values: an empty list converts to float64)
    dtype = np.result_type(*(part for part in (from_lists, from_others) if len(part)))
    merged = np.empty(len(in_lists), dtype=dtype)
    merged[in_lists] = from_lists
    merged[~in_lists] = from_others
    return merged
