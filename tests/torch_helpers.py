"""Builders for the torch-executor tests: the tiny model, small workloads, recorded runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from harness.config.specs import EngineSpec, HardwareSpec, ModelSpec, SystemSpec
from harness.engine.engine import EngineRun, run_engine
from harness.engine.scheduler import Scheduler
from harness.engine.torch_executor import TorchExecutor
from harness.config.systems import build_manager
from harness.workloads.request import Request

ROOT = Path(__file__).resolve().parents[1]
TINY = ModelSpec(**yaml.safe_load((ROOT / "conf" / "model" / "tiny.yaml").read_text()))
CPU = HardwareSpec(name="cpu", memory_gib=16.0, hbm_bandwidth_gbps=50.0, peak_fp16_tflops=1.0)
MAX_MODEL_LEN = 512


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny ops gain nothing from intra-op threads and stall on a busy CI host; restore after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def engine(**overrides) -> EngineSpec:
    base = dict(executor="torch", device="cpu", kv_capacity_slots=4096, max_num_seqs=16,
                max_num_batched_tokens=512, swap_space_gib=0.001, fast_forward=False,
                telemetry_interval_s=0)
    base.update(overrides)
    return EngineSpec(**base)


def paged(block_size: int = 16, prefix_caching: bool = False) -> SystemSpec:
    return SystemSpec(name="paged", kind="paged", block_size=block_size, prefix_caching=prefix_caching)


def contiguous(policy: str = "oracle", arena: str = "buddy") -> SystemSpec:
    return SystemSpec(name=policy, kind="contiguous", policy=policy, arena=arena)


def _request(i: int, ids: np.ndarray, output_len: int, **kw) -> Request:
    ids = np.asarray(ids, dtype=np.int32)
    ids.flags.writeable = False
    return Request(i, 0.0, ids, output_len, **kw)


def mixed_workload(seed: int = 5, n: int = 12) -> tuple[Request, ...]:
    """Half the prompts share a 40-token prefix; every 4th request asks for 3 parallel samples."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 1 << 29, 40, dtype=np.int32)
    out = []
    for i in range(n):
        samples = 3 if i % 4 == 0 else 1
        ids = rng.integers(0, 1 << 29, int(rng.integers(5, 30 if samples > 1 else 90)), dtype=np.int32)
        if i % 2:
            ids = np.concatenate([prefix, ids])
        out.append(_request(i, ids, int(rng.integers(1, 25)), num_samples=samples))
    return tuple(out)


def beam_workload(seed: int = 7) -> tuple[Request, ...]:
    rng = np.random.default_rng(seed)
    return tuple(_request(i, rng.integers(0, 1 << 29, int(rng.integers(5, 40)), dtype=np.int32),
                          int(rng.integers(3, 20)), beam_width=2 if i % 2 == 0 else 1)
                 for i in range(6))


class RecordingScheduler(Scheduler):
    """Keeps every finished request's tokens: {request_id: [tokens of sample 0, 1, ...]}."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tokens: dict[int, list[list[int]]] = {}

    def postprocess(self, plan, now, sampled=None):
        finished = super().postprocess(plan, now, sampled)
        for group in finished:
            self.tokens[group.request.request_id] = [
                s.generated_ids().tolist() for s in sorted(group.seqs, key=lambda s: s.lineage)]
        return finished


@dataclass
class TorchRun:
    run: EngineRun
    executor: TorchExecutor
    scheduler: RecordingScheduler

    @property
    def tokens(self) -> dict[int, list[list[int]]]:
        return self.scheduler.tokens

    @property
    def digest(self) -> str:
        return self.run.output_digest


def run_torch(requests, system: SystemSpec, spec: EngineSpec | None = None, *,
              model: ModelSpec = TINY, poison: bool = True) -> TorchRun:
    """One system through the real engine; KV memory poisoned with NaN so a read of a slot
    that was never written shows up as NaN logits, never as a lucky match."""
    spec = spec or engine()
    manager = build_manager(system, spec.kv_capacity_slots, model, spec, MAX_MODEL_LEN)
    scheduler = RecordingScheduler(manager, spec)
    executor = TorchExecutor(model, system, manager, spec, max_model_len=MAX_MODEL_LEN)
    if poison:
        executor.kv.fill_(float("nan"))
        if executor.cpu_kv is not None:
            executor.cpu_kv.fill_(float("nan"))
    result = run_engine(tuple(requests), scheduler, executor, spec, max_model_len=MAX_MODEL_LEN)
    return TorchRun(result, executor, scheduler)


def dense_greedy(model, prompt: np.ndarray, output_len: int) -> list[int]:
    """Greedy tokens by full recomputation (no cache) of the whole sequence every step."""
    tokens = list(int(t) for t in prompt)
    out = []
    for _ in range(output_len):
        logits = model.dense_logits(torch.tensor(tokens, dtype=torch.long))[-1]
        nxt = int(torch.argmax(logits))
        out.append(nxt)
        tokens.append(nxt)
    return out


__all__ = ["CPU", "MAX_MODEL_LEN", "TINY", "RecordingScheduler", "TorchRun", "beam_workload",
           "contiguous", "dense_greedy", "engine", "mixed_workload", "one_torch_thread", "paged",
           "run_torch"]
