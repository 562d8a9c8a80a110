"""glibc's malloc told to keep the memory it frees for the next allocations
(``reuse_freed_memory``), so that a large array reuses pages the process already has
instead of faulting in fresh ones.

By default glibc maps a block of 128 KiB or more straight from the kernel and unmaps it
when it is freed (the threshold rises with the blocks freed, up to 32 MiB), and hands the
heap's free top back past 128 KiB (or twice the threshold). Each large temporary then
touches pages the kernel has to map and zero one by one. The run's work after each
engine (phase columns, step tables, summaries: some hundreds of numpy arrays of 0.1-16
MB) spent 0.23-0.28 s of kernel time on Azure conv's four systems so; with blocks of up
to 32 MiB (glibc's largest threshold on 64-bit) taken from the heap and up to 1 GiB of
its free top kept, 0.05 s. Values are unchanged: only where memory comes from.
"""

from __future__ import annotations

import ctypes

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's upper limit on 64-bit
TRIM_THRESHOLD_BYTES = 1 << 30

__all__ = ["reuse_freed_memory"]


def reuse_freed_memory() -> bool:
    """Let this process's malloc keep what it frees (for blocks up to 32 MiB, and up to
    1 GiB of free heap), for the rest of the process. True where it was set (glibc);
    False where the C library has no ``mallopt`` or refused the values (nothing changed)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # (the process's own symbols: its C library's)
    except (OSError, AttributeError, TypeError):  # no mallopt (or no such lookup: Windows)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
