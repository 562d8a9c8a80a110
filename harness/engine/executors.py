"""Choose the executor a run uses: ``sim`` (cost model) or ``torch`` (real model)."""

from __future__ import annotations

from harness.config.parallelism import AllReduceCost, degree
from harness.config.specs import (CostSpec, EngineSpec, HardwareSpec, ModelSpec, SystemSpec,
                            kv_capacity_slots)
from harness.engine.cost_layered import LayeredOperatorCostModel, LayeredRooflineCostModel
from harness.engine.cost_layers import layered_attention
from harness.engine.cost_operator import OperatorCostModel
from harness.engine.sim_executor import OffloadLoadCost, RooflineCostModel, SimExecutor, layout_fit
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
        offload = engine.offload
        load = (OffloadLoadCost(model.bytes_per_slot, offload.disk_read_gbps)
                if offload.enabled else None)
        cost_model = make_cost_model(engine.cost, system, model, hardware,
                                     tensor_parallel=degree(engine))
        return SimExecutor(cost_model, unit,
                           *page_costs, offload_load=load)
    if engine.executor == "torch":
        from harness.engine.torch_executor import TorchExecutor

        return TorchExecutor(model, system, manager, engine,
                             max_model_len=max_model_len or engine.max_model_len or model.max_context,
                             seed=seed)
    raise ConfigError(f"engine.executor={engine.executor!r} is not available; use engine=sim or engine=torch")


def make_cost_model(cost: CostSpec, system: SystemSpec, model: ModelSpec,
                    hardware: HardwareSpec, tensor_parallel: int = 1
                    ) -> RooflineCostModel | OperatorCostModel:
    """``engine.cost.model``'s cost model for ``system`` (the operator model reads its
    layout and block size: the decode kernel's efficiency depends on them). A calibrated
    hardware profile measured on this model (``hardware.fitted``) prices with its fit,
    whichever model is selected: a measurement of this model beats either. A model whose
    layers are not all full attention gets the layered version of either
    (``harness.engine.cost_layered``). With ``tensor_parallel`` > 1, ``model`` is one GPU's
    shard and the operator model adds the all-reduces (``harness.config.parallelism``)."""
    from pagebench.allocators.registry import MANAGERS

    layout, page_tokens = MANAGERS[system.kind].kernel_layout(system, model)
    fitted = layout_fit(hardware, layout)
    layers = layered_attention(model)  # None: every layer full attention
    if cost.model == "operator" and not (fitted is not None and fitted.applies_to(model)):
        allreduce = AllReduceCost.of(model, hardware, tensor_parallel)
        if layers is not None:
            return LayeredOperatorCostModel(model, hardware, cost, layout, page_tokens, layers,
                                            allreduce=allreduce)
        return OperatorCostModel(model, hardware, cost, layout, page_tokens, allreduce=allreduce)
    if layers is not None:
        return LayeredRooflineCostModel(model, hardware, cost, layers, layout=layout)
    return RooflineCostModel(model, hardware, cost, layout=layout)


def check_cost_profiles(engine: EngineSpec, systems: list[SystemSpec], model: ModelSpec,
                        hardware: HardwareSpec) -> None:
    """Load and resolve every system's cost profiles now (a ``ConfigError`` naming the
    file and field), before a run touches its directory."""
    if engine.executor == "sim":
        for system in systems:
            make_cost_model(engine.cost, system, model, hardware,
                            tensor_parallel=degree(engine))


def executor_capacity_slots(model: ModelSpec, hardware: HardwareSpec, engine: EngineSpec, *,
                            max_model_len: int, seed: int = 0) -> int:
    """KV slots of the pool: the hardware profile's formula (sim), or the real device (torch)."""
    if engine.executor == "torch":
        from harness.engine.torch_device import torch_kv_capacity_slots

        return torch_kv_capacity_slots(model, hardware, engine, max_model_len=max_model_len, seed=seed)
    return kv_capacity_slots(model, hardware, engine)
