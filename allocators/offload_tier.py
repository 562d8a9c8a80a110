"""Lower tiers of the prefix cache: a CPU tier and an optional disk tier (``engine.offload``).

When the block pool reuses a free block that still holds a prefix-cache key (an eviction,
``BlockPool.allocate``), the key moves here instead of being forgotten:

- The CPU tier holds ``cpu_blocks`` keys in LRU order. A key stored when the tier is full
  pushes its least recently used key down to the disk tier (``disk_blocks`` keys, LRU too),
  or drops it when there is no disk tier; the disk tier's own LRU key is dropped when it
  overflows. A key is in at most one of the two tiers.
- At admission, after the GPU prefix hits end, the prompt's chain of block keys continues
  here (``match``): each following key found in the CPU or the disk tier is a hit of that
  tier, loaded into a newly allocated GPU block (``load``) instead of being recomputed.
- A loaded key STAYS in its tier and becomes its most recently used (as vLLM's
  ``LRUOffloadingManager.touch`` and SGLang's HiRadixCache, whose host copy outlives the
  device copy, do): when its GPU block is evicted again, nothing is written (the CPU copy is
  there already); a key evicted from the GPU while it is on disk moves up to the CPU tier.

The tier tracks keys only (no data: the sim prices the bytes, ``bytes_moved``). Stores are
counted in blocks each way; the caller prices loads (``harness.engine.sim_executor``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence

CPU, DISK = "cpu", "disk"


class OffloadTiers:
    """A CPU LRU tier of ``cpu_blocks`` keys and a disk LRU tier of ``disk_blocks`` keys."""

    __slots__ = ("cpu_blocks", "disk_blocks", "_cpu", "_disk", "gpu_to_cpu", "cpu_to_disk",
                 "disk_to_cpu", "dropped", "loaded")

    def __init__(self, cpu_blocks: int, disk_blocks: int = 0) -> None:
        if not isinstance(cpu_blocks, int) or cpu_blocks <= 0:
            raise ValueError(f"cpu_blocks must be a positive int, got {cpu_blocks!r}: the CPU "
                             "tier needs room for at least one block")
        if not isinstance(disk_blocks, int) or disk_blocks < 0:
            raise ValueError(f"disk_blocks must be an int >= 0, got {disk_blocks!r}")
        self.cpu_blocks = cpu_blocks
        self.disk_blocks = disk_blocks
        self._cpu: OrderedDict[int, None] = OrderedDict()  # key -> None, least recent first
        self._disk: OrderedDict[int, None] = OrderedDict()
        self.gpu_to_cpu = 0  # blocks written from the GPU pool to the CPU tier
        self.cpu_to_disk = 0  # blocks pushed from the CPU tier down to disk
        self.disk_to_cpu = 0  # keys evicted from the GPU while on disk: moved up (no copy read)
        self.dropped = 0  # keys that left the last tier (forgotten)
        self.loaded = {CPU: 0, DISK: 0}  # blocks loaded back into the GPU pool, by tier

    # ----------------------------------------------------------------- queries
    def tier_of(self, key: int) -> str | None:
        """``"cpu"``, ``"disk"`` or None. Changes nothing (no LRU touch)."""
        if key in self._cpu:
            return CPU
        return DISK if key in self._disk else None

    def cpu_keys(self) -> list[int]:
        """The CPU tier's keys, least recently used first (for tests and reports)."""
        return list(self._cpu)

    def disk_keys(self) -> list[int]:
        """The disk tier's keys, least recently used first."""
        return list(self._disk)

    def match(self, keys: Iterable[int]) -> int:
        """How many of ``keys``, from the first, are in a lower tier (a run that ends at the
        first key in neither). Changes nothing."""
        cpu, disk = self._cpu, self._disk
        found = 0
        for key in keys:
            if key not in cpu and key not in disk:
                break
            found += 1
        return found

    # ------------------------------------------------------------------ moves
    def store(self, keys: Sequence[int]) -> None:
        """Keys the GPU pool just evicted, in eviction order: each becomes the CPU tier's
        most recently used (written there unless the CPU tier holds it already)."""
        cpu, disk = self._cpu, self._disk
        for key in keys:
            if key in cpu:
                cpu.move_to_end(key)
                continue
            if key in disk:  # the GPU copy is newer in LRU terms: it goes up a tier
                del disk[key]
                self.disk_to_cpu += 1
            cpu[key] = None
            self.gpu_to_cpu += 1
            if len(cpu) > self.cpu_blocks:
                self._demote(cpu.popitem(last=False)[0])

    def _demote(self, key: int) -> None:
        """The CPU tier's LRU key goes to disk (or is dropped without one)."""
        if not self.disk_blocks:
            self.dropped += 1
            return
        disk = self._disk
        disk[key] = None
        self.cpu_to_disk += 1
        if len(disk) > self.disk_blocks:
            disk.popitem(last=False)
            self.dropped += 1

    def load(self, keys: Sequence[int]) -> tuple[int, int]:
        """Load these keys (a ``match``ed run) into GPU blocks: each stays in its tier as its
        most recently used. Returns (blocks from the CPU tier, blocks from disk)."""
        cpu, disk = self._cpu, self._disk
        from_cpu = 0
        for key in keys:
            if key in cpu:
                cpu.move_to_end(key)
                from_cpu += 1
            else:
                disk.move_to_end(key)  # KeyError: not a matched run (a caller's bug)
        from_disk = len(keys) - from_cpu
        self.loaded[CPU] += from_cpu
        self.loaded[DISK] += from_disk
        return from_cpu, from_disk

    def counts(self) -> dict[str, int]:
        """Blocks moved each way and held now (results.json's ``offload`` figures)."""
        return {"gpu_to_cpu": self.gpu_to_cpu, "cpu_to_disk": self.cpu_to_disk,
                "disk_to_cpu": self.disk_to_cpu, "dropped": self.dropped,
                "cpu_to_gpu": self.loaded[CPU], "disk_to_gpu": self.loaded[DISK],
                "cpu_held": len(self._cpu), "disk_held": len(self._disk)}
