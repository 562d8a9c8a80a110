"""numpy without transparent huge pages for a block of work (``without_huge_pages``).

numpy asks the kernel for huge pages (``madvise(MADV_HUGEPAGE)``) for every array of 4 MiB
or more. Where the kernel's huge pages are on ``madvise`` with ``defrag=madvise`` (this
project's 2-vCPU VMs, a common Linux default), the first touch of each 2 MiB page zeroes
it and may compact memory first: short-lived large temporaries then cost kernel time,
varying with the machine's memory from run to run. The switch is numpy's private
``_set_madvise_hugepage`` (numpy's ``global_state`` docs; numpy >= 1.20); without it,
nothing is switched.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

try:
    from numpy._core.multiarray import _get_madvise_hugepage, _set_madvise_hugepage  # numpy 2
except ImportError:
    try:
        from numpy.core.multiarray import _get_madvise_hugepage, _set_madvise_hugepage  # 1.x
    except ImportError:  # not in this numpy: nothing to switch
        def _get_madvise_hugepage() -> bool:
            return False

        def _set_madvise_hugepage(enabled: bool) -> bool:
            return False

__all__ = ["huge_pages_requested", "set_huge_pages", "without_huge_pages"]


def huge_pages_requested() -> bool:
    """Whether numpy asks for huge pages for large arrays now."""
    return bool(_get_madvise_hugepage())


def set_huge_pages(enabled: bool) -> bool:
    """Let numpy ask for huge pages (or not); returns the previous setting."""
    return bool(_set_madvise_hugepage(enabled))


@contextlib.contextmanager
def without_huge_pages() -> Iterator[None]:
    """Within the block numpy allocates without asking for huge pages; as before after it
    (an exception too). Values are unchanged: only how memory is paged in."""
    previous = set_huge_pages(False)
    try:
        yield
    finally:
        set_huge_pages(previous)
