"""Worker processes: how many CPUs this process may use, whether forking is safe, forking
without Python 3.12's warning about the native threads that are safe to fork, and pools
whose workers end with the process that started them."""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator

# Python 3.12+ warns at every fork() made while the process has more than one OS thread.
_FORK_WARNING = r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def fork_is_safe() -> bool:
    """Whether a forked child inherits no lock another thread may hold: fork exists (not
    on Windows), only this Python thread runs, and torch (whose thread pools are such
    threads) is not loaded. Workers forked then inherit every import at no cost."""
    return ("fork" in multiprocessing.get_all_start_methods()
            and threading.active_count() == 1 and "torch" not in sys.modules)


@contextmanager
def forking() -> Iterator[None]:
    """Forks made inside this block (creating fork-context workers) do not warn about the
    process's native threads.

    Python 3.12+ counts OS threads, and by then the process has some that Python did not
    start: OpenBLAS's workers (numpy) and jemalloc's background thread (pyarrow, through
    pandas). Both prepare for fork themselves (``pthread_atfork``), and ``fork_is_safe``
    has checked what they do not cover: no other Python thread, no torch. Only that one
    warning is silenced, only here.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_FORK_WARNING, category=DeprecationWarning)
        yield


# prctl(2) option: the signal this process gets when its parent (the thread that forked it) dies.
_PR_SET_PDEATHSIG = 1
_PARENT_POLL_S = 0.5  # where prctl is missing: how often a worker looks for its parent


def worker_pool(max_workers: int, mp_context: multiprocessing.context.BaseContext,
                initializer: Callable[..., None] | None = None,
                initargs: tuple = ()) -> ProcessPoolExecutor:
    """A ``ProcessPoolExecutor`` whose workers end with this process.

    A worker left behind by a killed parent (``kill -9``, out of memory) would go on
    simulating and write its tables into a run directory that a later run owns, then wait
    for work forever. Each worker first calls ``die_with_parent``, then
    ``initializer(*initargs)``, and adopts this process's run-directory claims
    (``harness.run.run_lock``), which its writes are checked against.
    """
    from harness.fileio import claims

    start = functools.partial(_start_worker, os.getpid(),
                              mp_context.get_start_method() != "forkserver", dict(claims()),
                              initializer, initargs)
    return ProcessPoolExecutor(max_workers, mp_context=mp_context, initializer=start)


def _start_worker(parent_pid: int, forked_by_parent: bool, claims: dict[str, str],
                  initializer: Callable[..., None] | None, initargs: tuple) -> None:
    from harness.fileio import adopt_claims

    die_with_parent(parent_pid, forked_by_parent)
    adopt_claims(claims)
    if initializer is not None:
        initializer(*initargs)


def die_with_parent(parent_pid: int, forked_by_parent: bool = True) -> None:
    """End this worker process as soon as ``parent_pid``, the process that started it, ends.

    Forked by it, on Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (through ctypes), then a
    check that the parent did not die before that took effect; elsewhere a daemon thread
    looks every ``_PARENT_POLL_S`` seconds whether it was re-parented. Started by a fork
    server (which outlives the main process while its workers hold its pipe): a daemon
    thread waits on the pipe from the main process (``parent_process().sentinel``).
    """
    if forked_by_parent and _set_parent_death_signal():
        if os.getppid() != parent_pid:
            os._exit(1)
        return
    threading.Thread(target=_watch_parent, args=(parent_pid, forked_by_parent),
                     name="pagebench-parent-watch", daemon=True).start()


def _set_parent_death_signal() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return False


def _watch_parent(parent_pid: int, forked_by_parent: bool) -> None:
    if forked_by_parent:  # pragma: no cover - not Linux: an orphan is re-parented
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_POLL_S)
    else:
        parent = multiprocessing.parent_process()
        if parent is None:  # pragma: no cover - not a multiprocessing worker
            return
        multiprocessing.connection.wait([parent.sentinel])  # readable at EOF: it is gone
    os._exit(1)
