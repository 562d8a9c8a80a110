"""Who owns a run directory: one run at a time, and no write from a process that lost it.

A run takes ``claim_run_dir(out_dir)`` for its whole length: an exclusive ``flock`` on
``out_dir/.pagebench.lock`` (a second run into the directory is refused while it is held;
the kernel drops it when the holder dies, however it dies) and a fresh token written into
that file. The token is this process's claim on the directory, inherited by its worker
processes (``harness.processes.worker_pool``). ``harness.fileio.check_owner`` runs
immediately before each atomic rename (``harness.fileio.atomic_write_bytes``): a process whose claim is not
the token in the lock file (a worker of a run killed with ``kill -9``, outlived by a later
run) may not write there. Directories without a lock file (a sweep's top directory, a
report written later) are anyone's.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Iterator

from harness.errors import RunDirectoryBusy
from harness.fileio import LOCK_NAME, claims, read_lock_token

__all__ = ["LOCK_NAME", "RunDirectoryBusy", "claim_run_dir"]


@contextlib.contextmanager
def claim_run_dir(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir`` for this run; ``RunDirectoryBusy`` (one line) when another run
    holds it. Where ``fcntl`` is missing (Windows) only the token is checked."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lock_path = out_dir / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a directory of that name, a read-only directory
        raise PagebenchError(f"{lock_path}: cannot open the run lock there ({exc.strerror}); "
                             "choose another directory (hydra.run.dir=...)") from None
    try:
        _lock_exclusively(fd, out_dir, lock_path)
        token = f"{os.getpid()} {uuid.uuid4().hex}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, (token + "\n").encode("ascii"), 0)
        key = os.path.realpath(out_dir)
        claims()[key] = token
        try:
            yield
        finally:
            claims().pop(key, None)
            os.ftruncate(fd, 0)  # the token dies with the run (and the directory is as it was)
    finally:
        os.close(fd)  # (releases the flock, once no worker holds the inherited descriptor)


def _lock_exclusively(fd: int, out_dir: Path, lock_path: Path) -> None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = read_lock_token(lock_path).split(" ")[0] or "?"
        raise RunDirectoryBusy(
            f"{out_dir}: another run (pid {holder}) is writing into this directory; wait for "
            f"it to end or choose another (hydra.run.dir=...)") from None
