"""``engine.offload``: the sizes of the CPU and disk tiers behind the GPU prefix cache.

What a run may offload (paged systems with a prefix cache, on the sim) is checked with the
run's other specs (``harness.run.run_setup.check_offload``); the tiers themselves are
``pagebench.allocators.offload_tier``; what a load costs is priced by the sim executor
(``harness.engine.sim_executor.OffloadLoadCost``); the figures results.json reports are
``harness.metrics.offload``.
"""

from __future__ import annotations

from pydantic import model_validator

from harness.spec_schema import Number, PositiveNumber, SpecProblem, spec
GIB = 1024**3


@spec
class OffloadSpec:
    """Sizes of the lower prefix-cache tiers (0 = none) and the disk's rates (GB/s, 1e9 B/s).

    The CPU tier moves blocks over the host link (the cost models' swap bandwidth); the disk
    tier reads at ``disk_read_gbps`` (and a load then crosses the host link too) and writes at
    ``disk_write_gbps`` (stores are asynchronous: counted, never charged).
    """

    cpu_gib: Number = 0.0
    disk_gib: Number = 0.0
    disk_read_gbps: PositiveNumber = 13.0
    disk_write_gbps: PositiveNumber = 6.6

    @model_validator(mode="after")
    def _disk_behind_cpu(self) -> "OffloadSpec":
        if self.disk_gib and not self.cpu_gib:
            raise SpecProblem("disk_gib", f"a disk tier ({self.disk_gib} GiB) sits behind the CPU "
                              "tier: set engine.offload.cpu_gib too (evicted blocks reach disk "
                              "through it)")
        return self

    @property
    def enabled(self) -> bool:
        return self.cpu_gib > 0

    def tier_blocks(self, block_bytes: int) -> tuple[int, int]:
        """(CPU blocks, disk blocks) of ``block_bytes`` each that the tiers hold: whole blocks."""
        return int(self.cpu_gib * GIB // block_bytes), int(self.disk_gib * GIB // block_bytes)
