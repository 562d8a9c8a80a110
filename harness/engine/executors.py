"""Choose the executor a run uses: ``sim`` (cost model) or ``torch`` (real model)."""

from __future__ import annotations

from harness.config import EngineSpec, HardwareSpec, ModelSpec, SystemSpec
from harness.engine.sim_executor import RooflineCostModel, SimExecutor
from harness.errors import ConfigError


def make_executor(engine: EngineSpec, system: SystemSpec, model: ModelSpec,
                  hardware: HardwareSpec, manager, *, seed: int = 0):
    """The executor that turns ``system``'s step plans into time (and tokens)."""
    unit = system.block_size if system.kind == "paged" else 1
    if engine.executor == "sim":
        return SimExecutor(RooflineCostModel(model, hardware, engine.cost), unit)
    raise ConfigError(f"engine.executor={engine.executor!r} is not available; use engine=sim")
