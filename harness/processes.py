"""Worker processes: how many CPUs this process may use, whether forking is safe, and forking
without Python 3.12's warning about the native threads that are safe to fork."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Iterator

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
