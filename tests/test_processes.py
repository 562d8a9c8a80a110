"""harness/processes.py: forking workers without Python 3.12's warning about native threads."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy  # noqa: F401 - starts OpenBLAS's worker threads, as every run has them

from harness.processes import forking


def _fork_warnings(block) -> list[str]:
    """The fork()-with-threads DeprecationWarnings (Python 3.12+) raised while forking a
    worker inside ``block``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
            with block():
                assert pool.submit(abs, -3).result() == 3
    return [str(w.message) for w in caught if "fork()" in str(w.message)]


def test_forking_silences_only_the_native_threads_warning():
    assert _fork_warnings(forking) == []
    native_threads = len(os.listdir("/proc/self/task")) > 1  # OpenBLAS's, after numpy
    if sys.version_info >= (3, 12) and native_threads:  # what it silences is really there
        assert _fork_warnings(contextlib.nullcontext)
    with warnings.catch_warnings(record=True) as caught:  # any other warning still shows
        warnings.simplefilter("always")
        with forking():
            warnings.warn("something else", DeprecationWarning)
    assert [str(w.message) for w in caught] == ["something else"]
