"""Refuse a run that clearly cannot fit in memory, before it starts.

A generated workload of ``workload.num_requests=1000000000`` used to be killed by the
kernel after minutes, at tens of GB. ``check_run_fits`` compares a lower bound of what the
run needs with the memory this process may still use, and refuses (one line, the figure
and the limit) only when even the lower bound does not fit: a run it lets through may
still need more.

The bound is ``MIN_BYTES_PER_REQUEST`` per generated request: this project's measurement
of the smallest run's peak RSS per request (``workload=fixed workload.prompt_len=1
workload.output_len=1 systems=[paged] jobs=1 report=false``, 50,000 and 250,000 requests:
196,484 and 420,564 KiB, 1,147 bytes per request between them, under
``/usr/bin/time -f %M``), rounded down. Longer prompts, more systems and worker processes
only add to it. Replayed traces are bounded by their files and not estimated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import ConfigError

MIN_BYTES_PER_REQUEST = 1000

_CGROUP_V2 = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current")
_CGROUP_V1 = ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
              "/sys/fs/cgroup/memory/memory.usage_in_bytes")


def available_memory_bytes() -> int | None:
    """What this process may still allocate: the least of MemAvailable (/proc/meminfo) and
    the room left under its cgroup's memory limit, when set; None where neither is known."""
    figures = [figure for figure in (_meminfo_available(), _cgroup_room()) if figure is not None]
    return min(figures) if figures else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    for limit_path, usage_path in (_CGROUP_V2, _CGROUP_V1):
        try:
            limit = Path(limit_path).read_text().strip()
            usage = int(Path(usage_path).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max" or v1's huge "unlimited"
            return max(0, int(limit) - usage)
    return None


def check_run_fits(workload_spec: Any, where: str = "workload") -> None:
    """``ConfigError`` naming ``<where>.num_requests`` when a generated workload's
    requests alone need more memory than is available (``available_memory_bytes``)."""
    from harness.workloads.spec import SyntheticSpec

    if not isinstance(workload_spec, SyntheticSpec):
        return
    needed = workload_spec.num_requests * MIN_BYTES_PER_REQUEST
    available = available_memory_bytes()
    if available is not None and needed > available:
        raise ConfigError(
            f"{where}.num_requests: {workload_spec.num_requests:,} requests need at least "
            f"{needed / 2**30:,.1f} GiB ({MIN_BYTES_PER_REQUEST} bytes each), more than the "
            f"{available / 2**30:,.1f} GiB of memory available; use fewer requests")
