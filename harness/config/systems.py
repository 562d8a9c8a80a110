"""Build a system's KV manager from its spec: the catalog's ``kind`` names a registered
manager class (``allocators.MANAGERS``), which builds itself (``from_system``)."""

from __future__ import annotations

from pagebench.allocators.registry import MANAGERS
from harness.config.specs import GIB, EngineSpec, ModelSpec, SystemSpec


def build_manager(system: SystemSpec, capacity_slots: int, model: ModelSpec, engine: EngineSpec,
                  max_model_len: int, cpu_slots: int | None = None):
    """The KV manager of ``system`` over ``capacity_slots`` device slots (+ CPU swap space,
    + the offload tiers of ``engine.offload``, which ``check_offload`` allowed; + a block
    residency log with ``engine.kv_residency``). ``cpu_slots``: the swap space's slots, when
    not ``engine.swap_space_gib``'s (``memory_estimate.pool_bytes``' small probe builds)."""
    cpu_slots = cpu_pool_slots(model, engine) if cpu_slots is None else cpu_slots
    manager = MANAGERS[system.kind].from_system(system, capacity_slots, cpu_slots, max_model_len,
                                                model)
    if engine.offload.enabled:
        from pagebench.allocators.offload_tier import OffloadTiers

        cpu_blocks, disk_blocks = engine.offload.tier_blocks(system.block_size * model.bytes_per_slot)
        manager.attach_offload(OffloadTiers(cpu_blocks, disk_blocks))
    if engine.kv_residency and manager.capabilities.block_residency:
        from pagebench.allocators.residency import ResidencyLog

        manager.attach_residency(ResidencyLog(manager.num_blocks))
    return manager


def cpu_pool_slots(model: ModelSpec, engine: EngineSpec) -> int:
    """The slots of the CPU swap space (``engine.swap_space_gib``) for ``model``."""
    return int(engine.swap_space_gib * GIB // model.bytes_per_slot)
