"""Worker processes: how many CPUs this process may use, and whether forking is safe."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading


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
