"""Build a system's KV manager and executor from its spec."""

from __future__ import annotations

from allocators.contiguous import ContiguousKVCacheManager
from allocators.paged import PagedKVCacheManager
from harness.config import GIB, EngineSpec, ModelSpec, SystemSpec


def build_manager(system: SystemSpec, capacity_slots: int, model: ModelSpec, engine: EngineSpec,
                  max_model_len: int):
    """The KV manager of ``system`` over ``capacity_slots`` device slots (+ CPU swap space)."""
    cpu_slots = int(engine.swap_space_gib * GIB // model.bytes_per_slot)
    if system.kind == "paged":
        block_size = system.block_size
        return PagedKVCacheManager(
            capacity_slots // block_size, block_size,
            enable_prefix_caching=system.prefix_caching,
            num_cpu_blocks=cpu_slots // block_size,
        )
    return ContiguousKVCacheManager(
        capacity_slots, policy=system.policy, max_model_len=max_model_len,
        arena=system.arena, num_cpu_slots=cpu_slots,
    )
