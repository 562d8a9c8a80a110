"""Builders for engine tests: small models, specs and request lists."""

from __future__ import annotations

import numpy as np

from harness.config.specs import CostSpec, EngineSpec, HardwareSpec, ModelSpec, SystemSpec
from harness.engine.engine import run_engine
from harness.engine.executors import make_executor
from harness.engine.scheduler import Scheduler
from harness.config.systems import build_manager
from harness.workloads.request import Request

MODEL = ModelSpec(name="t", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16,
                  intermediate_size=128, vocab_size=1000, max_context=4096, dtype="float16")
HARDWARE = HardwareSpec(name="h", memory_gib=1.0, hbm_bandwidth_gbps=100.0, peak_fp16_tflops=10.0)


def engine_spec(**overrides) -> EngineSpec:
    base = dict(kv_capacity_slots=1024, max_num_seqs=64, max_num_batched_tokens=4096,
                swap_space_gib=0.01, cost=CostSpec(model="roofline", step_overhead_s=0.001))
    base.update(overrides)
    return EngineSpec(**base)


def paged(block_size: int = 16, prefix_caching: bool = False) -> SystemSpec:
    return SystemSpec(name="paged", kind="paged", prefix_caching=prefix_caching,
                      block_size=block_size)


def contiguous(policy: str = "oracle", arena: str = "buddy") -> SystemSpec:
    return SystemSpec(name=policy, kind="contiguous", policy=policy, arena=arena)


def make_requests(lengths, *, gap: float = 0.0, prefix: np.ndarray | None = None,
                  num_samples: int = 1, beam_width: int = 1, seed: int = 0) -> tuple[Request, ...]:
    """Requests with (prompt_len, output_len) pairs, unique ids, optional shared prefix."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (prompt_len, output_len) in enumerate(lengths):
        ids = rng.integers(0, 1 << 29, prompt_len, dtype=np.int32)
        if prefix is not None:
            ids = np.concatenate([prefix, ids[len(prefix):]]) if prompt_len > len(prefix) else prefix[:prompt_len].copy()
        ids.flags.writeable = False
        out.append(Request(i, i * gap, ids, output_len, num_samples=num_samples,
                           beam_width=beam_width))
    return tuple(out)


def run(requests, system: SystemSpec, spec: EngineSpec | None = None, max_model_len: int = 4096):
    spec = spec or engine_spec()
    manager = build_manager(system, spec.kv_capacity_slots, MODEL, spec, max_model_len)
    scheduler = Scheduler(manager, spec)
    executor = make_executor(spec, system, MODEL, HARDWARE, manager)
    result = run_engine(requests, scheduler, executor, spec, max_model_len=max_model_len)
    if hasattr(executor, "phase_columns"):  # the operator cost model's seconds per phase
        result.recorder.add_columns(executor.phase_columns())
    return result
