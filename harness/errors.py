"""Errors a user can act on. The CLI prints their message, not a traceback."""

from __future__ import annotations

import difflib
from typing import Iterable


class PagebenchError(Exception):
    """Base of every error whose message is meant for the user."""


class ConfigError(PagebenchError, ValueError):
    """A config value is missing, unknown or invalid; the message says which and how to fix it."""


class InputError(PagebenchError, ValueError):
    """A data file (trace, results file) is malformed; the message names file, line and field."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        where = ":".join(str(p) for p in (path, line) if p is not None)
        prefix = f"{where}: " if where else ""
        if field is not None:
            prefix += f"field {field!r}: "
        super().__init__(prefix + message)
        self.path, self.line, self.field = path, line, field


class OutputError(PagebenchError, OSError):
    """An output cannot be written (disk full, read-only, a file where a directory must
    be); the message names the path and why. Nothing half-written is left behind."""


class RunDirectoryBusy(PagebenchError):
    """Another run holds the run directory, or took it over from this one
    (``harness.run.run_lock``; the write-side check is ``harness.fileio.check_owner``)."""


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """" Did you mean 'x'?" for the closest valid name to a misspelt one, or ""."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""
