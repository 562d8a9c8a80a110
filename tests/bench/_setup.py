"""Builders shared by the benchmarks: managers in a given state, composed run configs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "traces"


def unique_prompt(rng: np.random.Generator, n: int) -> np.ndarray:
    ids = rng.integers(0, 1 << 29, n, dtype=np.int32)
    ids.flags.writeable = False
    return ids


def compose(*overrides: str):
    """The run's config exactly as ``python -m harness`` composes it."""
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


class PreparedRun:
    """Everything ``harness.run.serve.run_serving`` builds before running the systems."""

    def __init__(self, *overrides: str) -> None:
        from harness.config.specs import (EngineSpec, HardwareSpec, ModelSpec, build_spec,
                                    kv_capacity_slots, select_systems)
        from harness.workloads import build_workload

        cfg = compose(*overrides, "progress=false")
        self.model = build_spec(ModelSpec, cfg.model, "model")
        self.hardware = build_spec(HardwareSpec, cfg.hardware, "hardware")
        self.engine = build_spec(EngineSpec, cfg.engine, "engine")
        self.seed = cfg.seed
        self.max_model_len = self.engine.max_model_len or self.model.max_context
        self.systems = {s.name: s for s in select_systems(cfg.systems, cfg.allocator, cfg.block_size)}
        self.capacity = kv_capacity_slots(self.model, self.hardware, self.engine)
        self.workload = build_workload(cfg.workload, seed=self.seed, max_model_len=self.max_model_len)

    def run(self, system_name: str):
        """One system through the engine on the sim executor (no files written)."""
        from harness.run.serve import _run_one

        return _run_one(self.systems[system_name], self.workload, self.model, self.hardware,
                        self.engine, self.capacity, self.max_model_len, self.seed, False)
