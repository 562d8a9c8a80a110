"""``engine.offload``: the CPU and disk tiers behind the GPU prefix cache: the spec, its
checks, and the figures results.json reports (``offload``).

The tiers themselves are ``pagebench.allocators.offload_tier``; what a load costs is priced by the
sim executor (``harness.engine.sim_executor.OffloadLoadCost``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import ConfigError
from harness.config.spec_checks import POSITIVE, _require, _require_number

if TYPE_CHECKING:
    from harness.config.specs import EngineSpec, ModelSpec, SystemSpec

GIB = 1024**3


@dataclass(frozen=True)
class OffloadSpec:
    """Sizes of the lower prefix-cache tiers (0 = none) and the disk's rates (GB/s, 1e9 B/s).

    The CPU tier moves blocks over the host link (the cost models' swap bandwidth); the disk
    tier reads at ``disk_read_gbps`` (and a load then crosses the host link too) and writes at
    ``disk_write_gbps`` (stores are asynchronous: counted, never charged).
    """

    cpu_gib: float = 0.0
    disk_gib: float = 0.0
    disk_read_gbps: float = 13.0
    disk_write_gbps: float = 6.6

    def validate(self, where: str) -> None:
        _require_number(self, where, "cpu_gib", "disk_gib")
        _require_number(self, where, "disk_read_gbps", "disk_write_gbps", rule=POSITIVE)
        _require(not (self.disk_gib and not self.cpu_gib), f"{where}.disk_gib",
                 f"a disk tier ({self.disk_gib} GiB) sits behind the CPU tier: set "
                 f"{where}.cpu_gib too (evicted blocks reach disk through it)")

    @property
    def enabled(self) -> bool:
        return self.cpu_gib > 0

    def tier_blocks(self, block_bytes: int) -> tuple[int, int]:
        """(CPU blocks, disk blocks) of ``block_bytes`` each that the tiers hold: whole blocks."""
        return int(self.cpu_gib * GIB // block_bytes), int(self.disk_gib * GIB // block_bytes)


def check_offload(engine: "EngineSpec", systems: "list[SystemSpec]", model: "ModelSpec") -> None:
    """With ``engine.offload`` on: every system is a paged manager with prefix caching, the
    executor is the sim, and each tier holds at least one block. Raises ``ConfigError``."""
    spec = engine.offload
    if not spec.enabled:
        return
    if engine.executor != "sim":
        raise ConfigError("engine.offload.cpu_gib: the offload tier is modelled by the sim "
                          "executor only; run it with engine=sim (or set engine.offload.cpu_gib=0)")
    for system in systems:
        if system.kind != "paged" or not system.prefix_caching:
            raise ConfigError(
                f"engine.offload.cpu_gib: system {system.name} ({system.kind}"
                f"{'' if system.kind != 'paged' else ', no prefix cache'}) has no block prefix "
                "cache to offload; run only paged systems with prefix_caching (e.g. "
                "systems=[paged]) or set engine.offload.cpu_gib=0")
        block_bytes = system.block_size * model.bytes_per_slot
        for key in ("cpu_gib", "disk_gib"):
            gib = getattr(spec, key)
            if gib and gib * GIB < block_bytes:
                raise ConfigError(
                    f"engine.offload.{key}: {gib} GiB is smaller than one KV block of "
                    f"{system.name} ({system.block_size} tokens x {model.bytes_per_slot:,} bytes "
                    f"= {block_bytes:,} bytes for {model.name}); give at least "
                    f"{block_bytes / GIB:.6g} GiB, or 0 for no tier")


def offload_figures(manager, scheduler, spec: OffloadSpec, block_size: int,
                    bytes_per_slot: int, load_cost) -> dict:
    """A run's offload figures that the manager and scheduler hold (``offload_summary``
    adds those of the step and request tables)."""
    tiers = manager.offload
    counts = tiers.counts()
    block_bytes = block_size * bytes_per_slot
    loaded = scheduler.offload_tokens_cached
    queried = scheduler.prompt_tokens_queried
    hits = {"gpu": scheduler.prompt_tokens_cached - loaded["cpu"] - loaded["disk"],
            "cpu": loaded["cpu"], "disk": loaded["disk"]}
    moved = {way: counts[way] * block_bytes
             for way in ("gpu_to_cpu", "cpu_to_disk", "cpu_to_gpu", "disk_to_gpu")}
    return {
        # [request id, seconds its own loads took], for the per-request share of TTFT
        "_request_load_s": [(rid, cpu * load_cost.cpu_slot_s + disk * load_cost.disk_slot_s)
                            for rid, (cpu, disk) in scheduler.offload_loads.items()],
        "cpu_gib": spec.cpu_gib, "disk_gib": spec.disk_gib,
        "cpu_blocks": tiers.cpu_blocks, "disk_blocks": tiers.disk_blocks,
        "block_bytes": block_bytes,
        "hit_tokens": hits,
        "hit_rate": {tier: round(tokens / queried, 6) if queried else None
                     for tier, tokens in hits.items()},
        "blocks_moved": counts,
        "bytes_moved": moved,
        "load_s_per_slot": {"cpu": load_cost.cpu_slot_s, "disk": load_cost.disk_slot_s},
        # stores run asynchronously (vLLM's offloading connector, LMCache): never charged;
        # the time each link would be busy with them, to compare with the run's length
        "async_store_busy_s": {
            "gpu_to_cpu": round(moved["gpu_to_cpu"] / (load_cost.host_link_gbps * 1e9), 6),
            "cpu_to_disk": round(moved["cpu_to_disk"] / (spec.disk_write_gbps * 1e9), 6)},
    }


def offload_summary(figures: dict, steps, requests) -> dict:
    """``figures`` with the load time: its total (the steps' ``offload_load_s``), its share of
    the finished requests' summed TTFT (the load delays the step that admits them), and per
    finished request the share of its TTFT its own loads took (percentiles, 0 for a request
    that loaded nothing)."""
    import numpy as np

    from harness.metrics.summaries import percentiles

    figures = dict(figures)
    own = dict(figures.pop("_request_load_s"))
    load_s = float(steps["offload_load_s"].sum()) if "offload_load_s" in steps else 0.0
    done = requests[requests["status"] == "finished"]
    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy(dtype=float)
    mine = np.array([own.get(rid, 0.0) for rid in done["request_id"].tolist()], dtype=float)
    positive = ttft > 0
    total = float(ttft.sum())
    return {**figures, "load_s": round(load_s, 6),
            "load_share_of_ttft": round(load_s / total, 6) if total > 0 else None,
            "request_load_share_of_ttft": percentiles(mine[positive] / ttft[positive])}
