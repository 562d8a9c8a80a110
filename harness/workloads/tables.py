"""Reading trace files (CSV, JSONL, JSON, parquet; optionally .gz) into raw columns.

Readers keep the line (or, for parquet, the row) of every record so that every
error names file, line and field. They read raw values only; ``rows.RowParser``
turns them into typed columns. Nothing here allocates per token.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from harness.errors import ConfigError, InputError
from harness.fileio import STRICT_JSON, TOO_DEEP, RepeatedKey, launch_path, long_integer

FORMATS = ("csv", "jsonl", "json", "parquet")
_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json",
               ".parquet": "parquet", ".pq": "parquet"}


@dataclass
class Table:
    """Raw values of the requested columns; ``None`` marks a missing value."""

    path: str
    format: str
    columns: dict[str, list[Any]]
    lines: list[int]  # line (parquet: row) number of each record, 1-based
    # Record-level problems found while reading (bad JSON, not an object): row -> (field, kind, detail)
    errors: dict[int, tuple[str | None, str, str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.lines)


def resolve_path(path: str, where: str = "workload") -> Path:
    """``path`` as an existing file; relative paths are taken from the directory the user ran in."""
    candidate = launch_path(path)
    if candidate.is_dir():
        raise ConfigError(f"{where}.path: {candidate} is a directory: name the trace file in it")
    if candidate.exists() and not candidate.is_file():  # a FIFO, a device (/dev/zero), a socket
        raise ConfigError(f"{where}.path: {candidate} is {_file_kind(candidate)}, not a regular "
                          "file: a trace is read whole, from a file (copy it into one)")
    if not candidate.is_file():
        raise ConfigError(f"{where}.path: no such file: {candidate} (set {where}.path to an existing trace "
                          "file; relative paths are taken from the directory you ran the command in)")
    return candidate


def _file_kind(path: Path) -> str:
    """What ``path`` (not a regular file, nor a directory) is, in words."""
    import stat

    mode = path.stat().st_mode
    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def detect_format(path: Path, fmt: str, where: str = "workload") -> tuple[str, bool]:
    """(format, gzipped) from ``fmt`` or, when ``fmt`` is 'auto', the file extension."""
    suffixes = [s.lower() for s in path.suffixes]
    gzipped = bool(suffixes) and suffixes[-1] == ".gz"
    if gzipped:
        suffixes = suffixes[:-1]
    if fmt != "auto":
        return fmt, gzipped
    ext = suffixes[-1] if suffixes else ""
    if ext not in _EXTENSIONS:
        raise ConfigError(f"{where}.format: cannot tell the format of {path.name} from its extension "
                          f"{ext or '(none)'!r}; set {where}.format to one of {', '.join(FORMATS)}")
    return _EXTENSIONS[ext], gzipped


# A gzip-compressed trace may expand at most this many times its size once past
# GZIP_FREE_BYTES: the shared traces compress 2.2x (sharegpt_lengths CSV) to 4.0x (Azure code
# CSV; gzip -c FILE | wc -c), and gzip's own limit is about 1,032x: a file past 100x is a
# "gzip bomb" that would fill memory, not a trace.
GZIP_MAX_RATIO = 100
GZIP_FREE_BYTES = 64 * 2**20


class _BoundedGzip(io.RawIOBase):
    """A gzip file's decompressed bytes, refused (``InputError``) past ``GZIP_MAX_RATIO``
    times its compressed size (and ``GZIP_FREE_BYTES``)."""

    def __init__(self, path: Path) -> None:
        self._path, self._file = path, gzip.open(path, "rb")
        self._limit = max(GZIP_FREE_BYTES, GZIP_MAX_RATIO * os.path.getsize(path))
        self._read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = self._file.readinto(buffer)
        self._read += count
        if self._read > self._limit:
            raise InputError(
                f"decompresses to more than {self._limit / 2**20:,.0f} MiB, over "
                f"{GZIP_MAX_RATIO}x its compressed size (traces compress 2-4x): not read (a gzip "
                "bomb?); decompress it yourself if it is a trace", path=str(self._path))
        return count

    def close(self) -> None:
        self._file.close()
        super().close()


def _open_text(path: Path, gzipped: bool) -> io.TextIOBase:
    if gzipped:
        return io.TextIOWrapper(io.BufferedReader(_BoundedGzip(path)), encoding="utf-8-sig",
                                newline="")
    return open(path, encoding="utf-8-sig", newline="")


def read_table(path: Path, fmt: str, columns: Sequence[str], where: str = "workload") -> Table:
    """The raw values of ``columns`` (all required) from a CSV/JSONL/JSON/parquet file."""
    fmt, gzipped = detect_format(path, fmt, where)
    try:
        if fmt == "csv":
            table = _read_csv(path, gzipped, columns)
        elif fmt == "parquet":
            table = _read_parquet(path, columns)
        else:
            table = _read_records(path, gzipped, fmt, columns)
    except UnicodeDecodeError as err:
        raise InputError(f"not a UTF-8 text file ({err.reason}); is {where}.format right?",
                         path=str(path)) from None
    except (EOFError, OSError) as err:  # truncated or bad gzip, unreadable file
        raise InputError(f"cannot read the file: {err}", path=str(path)) from None
    if len(table) == 0:
        raise InputError("the file has no data rows", path=str(path))
    return table


def _check_named_once(path: Path, names: list[str], column: str, line: int | None) -> None:
    """A column the workload reads must be named exactly once in the file's header: a
    second one would be ignored silently (which holds the values cannot be told)."""
    count = names.count(column)
    if count == 1:
        return
    what = ("missing column; the header has" if count == 0 else
            f"the header names this column {count} times (which one holds the values is "
            "ambiguous: rename or drop the others); the columns")
    raise InputError(f"{what}: {', '.join(names)}", path=str(path), line=line, field=column)


def _read_csv(path: Path, gzipped: bool, columns: Sequence[str]) -> Table:
    with _open_text(path, gzipped) as f:
        reader = csv.reader(f, strict=True)  # (a quote never closed is an error, not the rest)
        parsed_to = 0  # the last line of the last record read
        try:
            header = next(reader, None)
            while header is not None and not any(cell.strip() for cell in header):
                header = next(reader, None)
            if header is None:
                raise InputError("the file is empty (expected a header row naming the columns)", path=str(path))
            names = [cell.strip() for cell in header]
            header_line = parsed_to = reader.line_num
            index = []
            for column in columns:
                _check_named_once(path, names, column, header_line)
                index.append(names.index(column))
            values: list[list[Any]] = [[] for _ in columns]
            lines: list[int] = []
            errors: dict[int, tuple[str | None, str, str]] = {}
            for row in reader:
                parsed_to = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # blank line
                width = len(row)
                if width > len(names):  # a shifted or merged row: no field can be trusted
                    errors[len(lines)] = (None, "invalid record",
                                          f"{width} fields, but the header names {len(names)}")
                lines.append(reader.line_num)
                for out, i in zip(values, index):
                    out.append(row[i] if i < width else None)
        except csv.Error as err:
            if str(err) == "unexpected end of data":  # inside quotes at the end of the file
                raise InputError("unterminated quote: the quoted field that starts on this line "
                                 "is never closed (it runs to the end of the file)",
                                 path=str(path), line=parsed_to + 1) from None
            raise InputError(f"malformed CSV: {err}", path=str(path), line=reader.line_num) from None
    return Table(str(path), "csv", dict(zip(columns, values)), lines, errors)


def iter_records(path: Path, gzipped: bool, fmt: str) -> Iterator[tuple[int, Any, str | None]]:
    """(line, record, error) for each JSONL line or element of a top-level JSON array.

    ``error`` is a message when the record itself could not be decoded (JSONL
    only; a broken JSON array cannot be resynchronised and raises InputError).
    """
    with _open_text(path, gzipped) as f:
        if fmt == "jsonl":
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:  # (without its line break: a string cut short is then "unterminated")
                    yield line_no, STRICT_JSON.decode(line.rstrip("\r\n")), None
                except json.JSONDecodeError as err:
                    what = err.msg.removesuffix(" at")  # "Unterminated string starting at"
                    yield line_no, None, f"not valid JSON ({what} at column {err.colno})"
                except RepeatedKey as err:
                    yield line_no, None, str(err)
                except RecursionError:
                    yield line_no, None, TOO_DEEP
                except ValueError as err:  # an integer of more than 4,300 digits
                    found = long_integer(err, line)
                    if found is None:
                        raise
                    yield line_no, None, found[0] + (f" in field {found[2]!r}" if found[2] else "")
            return
        text = f.read()
    yield from _iter_json_array(text, str(path))


def _iter_json_array(text: str, path: str) -> Iterator[tuple[int, Any, str | None]]:
    ws = " \t\r\n"
    pos, line, counted = 0, 1, 0

    def skip(p: int) -> int:
        while p < len(text) and text[p] in ws:
            p += 1
        return p

    def line_at(p: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, p)
        counted = p
        return line

    pos = skip(pos)
    if pos == len(text):
        raise InputError("the file is empty", path=path)
    if text[pos] != "[":
        raise InputError("expected a JSON array of records (or use format jsonl)", path=path, line=line_at(pos))
    pos = skip(pos + 1)
    if pos < len(text) and text[pos] == "]":
        return
    while True:
        start_line = line_at(pos)
        try:
            record, pos = STRICT_JSON.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise InputError(f"not valid JSON: {err.msg}", path=path, line=err.lineno) from None
        except RepeatedKey as err:
            raise InputError(str(err), path=path, line=start_line) from None
        except RecursionError:
            raise InputError(TOO_DEEP, path=path, line=start_line) from None
        except ValueError as err:  # an integer of more than 4,300 digits
            found = long_integer(err, text[pos:])
            if found is None:
                raise
            raise InputError(found[0], path=path, line=line_at(pos) + found[1] - 1,
                             field=found[2]) from None
        yield start_line, record, None
        pos = skip(pos)
        if pos < len(text) and text[pos] == ",":
            pos = skip(pos + 1)
            continue
        if pos < len(text) and text[pos] == "]":
            return
        raise InputError("not valid JSON: expected ',' or ']' between records", path=path, line=line_at(pos))


def _read_records(path: Path, gzipped: bool, fmt: str, columns: Sequence[str]) -> Table:
    values: list[list[Any]] = [[] for _ in columns]
    lines: list[int] = []
    errors: dict[int, tuple[str | None, str, str]] = {}
    for line, record, error in iter_records(path, gzipped, fmt):
        row = len(lines)
        lines.append(line)
        if error is None and not isinstance(record, dict):
            error = f"expected a JSON object, got {type(record).__name__}"
        if error is not None:
            errors[row] = (None, "invalid record", error)
            for out in values:
                out.append(None)
            continue
        if row == len(errors) and not any(column in record for column in columns):
            # the first good record has none of them: another kind of trace
            raise InputError(f"the record has none of the fields {', '.join(columns)} (it has: "
                             f"{', '.join(map(str, list(record)[:12])) or 'nothing'}); is this "
                             "the trace this workload reads?", path=str(path), line=line)
        for out, column in zip(values, columns):
            out.append(record.get(column))
    return Table(str(path), fmt, dict(zip(columns, values)), lines, errors)


def _read_parquet(path: Path, columns: Sequence[str]) -> Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        for column in columns:
            _check_named_once(path, schema.names, column, None)
        data = pq.read_table(path, columns=list(columns))
    except (pa.ArrowException, OSError) as err:
        raise InputError(f"not a readable parquet file: {err}", path=str(path)) from None
    return Table(str(path), "parquet", {c: data.column(c).to_pylist() for c in columns},
                 list(range(1, data.num_rows + 1)))
