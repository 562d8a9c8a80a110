"""Argument types for the small command-line tools (``harness.calibrate``, ``harness.hostcost``).

As ``type=`` of ``argparse`` arguments they turn a bad value into argparse's own
"error: argument --x: ..." and exit status 2, before anything is measured.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_ints(text: str) -> tuple[int, ...]:
    """A comma list of integers >= 1, e.g. ``1,8,32``."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or "" in items:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers such as 1,8,32, "
                                         f"got {text!r}")
    return tuple(positive_int(item) for item in items)


def output_file(text: str) -> Path:
    """A file path that can be written: not a directory, in a folder that exists (or is made
    now) and takes a new file. Checked before a long measurement, not after it."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a directory: name a file in it")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {path}: {folder} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(f"cannot write {path}: {err.strerror or err}") from None
    return path
