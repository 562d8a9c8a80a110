"""Run outputs: schema-versioned results.json, tables, a file's sha256 and
the files a run writes (set aside before a re-run). File I/O itself is ``harness.fileio``;
what a reader of results.json needs (its schema version, ``read_results``, where earlier runs
are set aside) is the shared ``harness.results_format``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import OutputError
from harness.fileio import STRICT_JSON, atomic_open, write_error_reason
from harness.results_format import SCHEMA_VERSION, next_previous_dir

if TYPE_CHECKING:  # pandas is imported lazily: the gate CLI does not need it
    import pandas as pd


def write_table(path: Path, frame: pd.DataFrame) -> None:
    """A table as CSV (RFC 4180, strings quoted, nulls empty), atomically.

    NOTE: pyarrow's writer, about 8x faster than ``DataFrame.to_csv`` on step tables
    of 10^5-10^6 rows; floats keep their shortest round-trip form. It writes into the file
    as it goes: a whole table in memory first (a 58 MB bytes object on Azure, grown and
    copied) cost as much CPU again as the writing. A table of numbers (a step table) is
    written by ``number_csv`` (the same bytes, in about a sixth less CPU).
    """
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    from harness.run.number_csv import is_number_table, write_number_csv

    table = pa.Table.from_pandas(frame, preserve_index=False)
    with atomic_open(path) as handle:
        if is_number_table(table):
            write_number_csv(table, handle)
        else:
            pa_csv.write_csv(table, handle)


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# The files a run writes into its directory (``run_serving``, kernels, studies, a sweep's
# failure marker): a later run in the same directory moves them aside first.
RUN_OUTPUTS = ("results.json", "run_info.json", "config_resolved.yaml", "report.html",
               "nvml_samples.csv", "steps_*.csv", "requests_*.csv", "kernel_results.*",
               "study.json", "job_failed.txt")


def set_aside_previous_run(out_dir: Path) -> Path | None:
    """Move an earlier run's outputs in ``out_dir`` into ``out_dir/previous/<n>/`` (n = 1,
    2, ...: the first that is free), so that a new run neither overwrites them nor leaves
    them mixed with its own (a table of a system it does not run, a complete results.json
    beside an interrupted run). Returns that directory, or None when there were none.

    NOTE: Hydra rewrites ``.hydra/`` before the run starts: the earlier run's config is
    its ``config_resolved.yaml``, moved with the rest (a lone ``config_resolved.yaml`` is
    just replaced: a run that stopped on bad input leaves only that). Other files stay.
    """
    out_dir = Path(out_dir)
    found = sorted({path for pattern in RUN_OUTPUTS for path in out_dir.glob(pattern)
                    if path.is_file()})
    if [path.name for path in found] in ([], ["config_resolved.yaml"]):
        return None  # nothing, or all that a run stopped by its bad input leaves: replace it
    dest = next_previous_dir(out_dir)
    try:
        dest.mkdir(parents=True)
        for path in found:
            os.replace(path, dest / path.name)
    except OSError as exc:
        raise OutputError(f"{dest}: cannot move the earlier run's outputs there: "
                          f"{write_error_reason(exc, dest / 'x')}") from None
    return dest


def existing_complete_results(out_dir: Path, cfg_hash: str) -> Path | None:
    """``out_dir/results.json`` if it is complete and was made from the same config."""
    path = Path(out_dir) / "results.json"
    if not path.is_file():
        return None
    try:
        data = STRICT_JSON.decode(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # unreadable: run again and overwrite it
    if (isinstance(data, dict) and data.get("schema_version") == SCHEMA_VERSION
            and data.get("complete") is True and data.get("config_hash") == cfg_hash):
        return path
    return None
