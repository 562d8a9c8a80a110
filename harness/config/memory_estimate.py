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

``check_pools_fit`` does the same for the KV managers' own Python objects (a pool of 10^8
blocks at ``block_size=1`` is several GB before the first step): ``pool_bytes`` measures two
small builds of the system's manager and extrapolates to the run's pool.
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


# A KV manager's pools hold Python objects per block (a paged pool's free queue, reference
# counts, cache keys: 65.7 bytes per block measured with tracemalloc over 10^6 blocks; a radix
# tree's 40 bytes per slot), so a pool of 10^9 blocks needs tens of GB before the first step.
# ``pool_bytes`` builds the system's manager at two small sizes and extrapolates linearly.
PROBE_BLOCKS = (1 << 12, 1 << 14)


def pool_bytes(system: Any, capacity_slots: int, cpu_slots: int, max_model_len: int,
               model: Any, engine: Any) -> int | None:
    """The Python memory (bytes) that building ``system``'s manager over ``capacity_slots``
    device slots and ``cpu_slots`` swap slots takes, extrapolated from two builds of
    ``PROBE_BLOCKS`` blocks (tracemalloc) as ``build_manager`` builds it for ``engine`` (its
    residency log, offload tiers); None for a pool no larger than the probes, or one the
    probes cannot build (the real build reports its own problem)."""
    import tracemalloc

    from harness.config.systems import build_manager

    unit = getattr(system, "block_size", None) or 1
    sizes = [blocks * unit for blocks in PROBE_BLOCKS]
    if capacity_slots <= sizes[-1]:
        return None
    figures = []
    for size in sizes:
        scale = size / capacity_slots
        was_tracing = tracemalloc.is_tracing()
        if not was_tracing:
            tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            manager = build_manager(system, size, model, engine, max_model_len,
                                    cpu_slots=int(cpu_slots * scale))
            figures.append(tracemalloc.get_traced_memory()[0] - before)
            del manager
        except Exception:  # noqa: BLE001 - a probe too small for the system: no estimate
            return None
        finally:
            if not was_tracing:
                tracemalloc.stop()
    per_slot = (figures[1] - figures[0]) / (sizes[1] - sizes[0])
    return int(figures[0] + per_slot * (capacity_slots - sizes[0]))


def check_pools_fit(systems: list, capacity_slots: int, cpu_slots: int, max_model_len: int,
                    model: Any, engine: Any, jobs: int = 1) -> None:
    """``ConfigError`` when building the managers (``jobs`` at once: the largest ones) needs
    more memory than is available, naming the largest pool and the figure."""
    available = available_memory_bytes()
    if available is None:
        return
    sized = sorted(((pool_bytes(s, capacity_slots, cpu_slots, max_model_len, model, engine)
                     or 0, s) for s in systems), key=lambda pair: -pair[0])
    needed = sum(size for size, _ in sized[:max(1, jobs)])
    if needed <= available:
        return
    size, system = sized[0]
    block = f" of block {system.block_size}" if getattr(system, "block_size", None) else ""
    raise ConfigError(
        f"systems: {system.name}'s KV pool{block} over {capacity_slots:,} slots (+ {cpu_slots:,} "
        f"swap slots) takes about {size / 2**30:,.1f} GiB of Python memory to build"
        + (f" ({needed / 2**30:,.1f} GiB for {min(jobs, len(sized))} systems at once)"
           if needed != size else "")
        + f", more than the {available / 2**30:,.1f} GiB available; raise block_size, or lower "
        "engine.kv_capacity_slots or engine.swap_space_gib")
