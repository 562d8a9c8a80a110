"""With ``reuse_freed_memory`` a large array freed and allocated again reuses the pages the
process already has: the second one faults in (almost) none, where glibc's defaults unmap
the block on free and map fresh pages for the next."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.run.malloc_reuse import reuse_freed_memory

# Minor page faults of touching a fresh 24 MiB array after one of the same size was freed
# (the first maps the block, glibc's default then unmaps it and raises its threshold)
PROBE = """
import resource, sys
import numpy as np
from harness.run.huge_pages import set_huge_pages
from harness.run.malloc_reuse import reuse_freed_memory
set_huge_pages(False)  # (a fault per 4 KiB page)
if sys.argv[1] == "reuse":
    assert reuse_freed_memory()
size = 24 << 20
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    array = np.ones(size // 8)  # touched
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del array
print(faults)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not reuse_freed_memory(),
                    reason="glibc's mallopt")
def test_a_freed_block_is_reused_instead_of_mapped_again():
    pages = (24 << 20) // 4096
    assert _faults("default") > pages // 2  # fresh pages: a fault each
    assert _faults("reuse") < pages // 20
