"""Errors a user can act on. The CLI prints their message, not a traceback."""

from __future__ import annotations


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
