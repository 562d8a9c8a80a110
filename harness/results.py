"""Writing run outputs: atomic files, schema-versioned results.json, tables."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

SCHEMA_VERSION = 1


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_table(path: Path, frame: pd.DataFrame) -> None:
    """A table as CSV, atomically."""
    atomic_write_text(path, frame.to_csv(index=False))


def read_results(path: Path) -> dict:
    """Load a results.json, checking it is one this version understands."""
    from harness.errors import InputError

    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.exists():
        raise InputError("results file not found; pass a run directory or its results.json",
                         path=str(path))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON (truncated?): {exc.msg}", path=str(path),
                         line=exc.lineno) from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise InputError("not a pagebench results file (no schema_version)", path=str(path))
    if data["schema_version"] != SCHEMA_VERSION:
        raise InputError(
            f"schema_version {data['schema_version']} is not supported (this pagebench reads "
            f"{SCHEMA_VERSION}); re-run or re-render with the matching version", path=str(path))
    for key in ("systems", "workload"):
        if key not in data:
            raise InputError(f"missing key {key!r}", path=str(path), field=key)
    return data
