"""Choose the executor a run uses: ``sim`` (cost model) or ``torch`` (real model)."""

from __future__ import annotations

from harness.config import EngineSpec, HardwareSpec, ModelSpec, SystemSpec, kv_capacity_slots
from harness.engine.sim_executor import RooflineCostModel, SimExecutor
from harness.errors import ConfigError


def make_executor(engine: EngineSpec, system: SystemSpec, model: ModelSpec,
                  hardware: HardwareSpec, manager, *, seed: int = 0,
                  max_model_len: int | None = None):
    """The executor that turns ``system``'s step plans into time (and tokens).

    ``torch`` imports torch lazily (the sim path never does) and needs the manager the
    scheduler drives: its KV tensors are laid out by that manager.
    """
    unit = system.block_size if system.kind == "paged" else 1
    if engine.executor == "sim":
        # page mapping (vattention) is charged per page, unless it overlaps compute
        charged = manager.capabilities.maps_pages and not system.option("async_mapping")
        page_costs = (system.option("map_page_s"), system.option("unmap_page_s")) if charged else ()
        return SimExecutor(RooflineCostModel(model, hardware, engine.cost), unit, *page_costs)
    if engine.executor == "torch":
        from harness.engine.torch_executor import TorchExecutor

        return TorchExecutor(model, system, manager, engine,
                             max_model_len=max_model_len or engine.max_model_len or model.max_context,
                             seed=seed)
    raise ConfigError(f"engine.executor={engine.executor!r} is not available; use engine=sim or engine=torch")


def executor_capacity_slots(model: ModelSpec, hardware: HardwareSpec, engine: EngineSpec, *,
                            max_model_len: int, seed: int = 0) -> int:
    """KV slots of the pool: the hardware profile's formula (sim), or the real device (torch)."""
    if engine.executor == "torch":
        from harness.engine.torch_device import torch_kv_capacity_slots

        return torch_kv_capacity_slots(model, hardware, engine, max_model_len=max_model_len, seed=seed)
    return kv_capacity_slots(model, hardware, engine)
