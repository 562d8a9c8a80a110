"""A run directory that cannot be used, refused before Hydra touches it.

Hydra creates the run directory, its ``.hydra/`` files and its log file before pagebench's
own checks run, and reports a directory it cannot use with a traceback (a path that is a
file, or under one, or under ``/proc``; "Unable to configure handler 'file'" on a read-only
file system). ``run_dir_problem`` finds each of these first (``python -m harness`` calls it
before ``hydra.main``), so the run stops in one line (exit 2) with nothing written: a
name longer than the file system allows, a file where a directory must be, a directory
that cannot be created or written into, and a lock path (``.pagebench.lock``) that is
not a file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from harness.fileio import write_error_reason
from harness.run.run_lock import LOCK_NAME


def run_dir_problem(path: Path) -> str | None:
    """What keeps a run from writing into ``path`` (created here when it is missing, as
    Hydra would), or None when it can."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    limit = _name_max(existing)
    for name in path.relative_to(existing).parts:
        if len(os.fsencode(name)) > limit:
            return (f"the name {name[:24]}... is {len(os.fsencode(name))} bytes long, more than "
                    f"the {limit} a file name may have there")
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create it: {_reason(exc, path)}"
    lock = path / LOCK_NAME
    if os.path.lexists(lock) and not lock.is_file():
        return f"{lock} is not a file (pagebench keeps its run lock there): remove it"
    try:
        fd, probe = tempfile.mkstemp(prefix=".pagebench-probe.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write into it: {_reason(exc, path / 'x')}"
    return None


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory if directory.is_dir() else directory.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _reason(exc: OSError, path: Path) -> str:
    if str(path).startswith("/proc/") or str(path).startswith("/sys/"):
        return f"{exc.strerror} (a kernel file system: write elsewhere)"
    return write_error_reason(exc, path)
