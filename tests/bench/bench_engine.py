"""The engine: one scheduler step at batch 256, and whole simulated runs."""

from __future__ import annotations

import numpy as np
import pytest

from _setup import TRACES, PreparedRun, unique_prompt
from harness.config.specs import EngineSpec
from harness.engine.scheduler import Scheduler
from harness.engine.sequence import SequenceGroup
from harness.config.systems import build_manager
from harness.config.specs import ModelSpec, SystemSpec
from harness.workloads.request import Request

BATCH = 256
MODEL = ModelSpec(name="llama-2-13b", num_layers=40, hidden_size=5120, num_heads=40,
                  num_kv_heads=40, head_dim=128, intermediate_size=13824, vocab_size=32000,
                  max_context=4096)


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["nocache", "prefix_cache"])
def bench_scheduler_step_batch_256(benchmark, prefix_caching):
    """One call: schedule() + postprocess() of a decode step with 256 running sequences."""
    spec = EngineSpec(max_num_seqs=BATCH, max_num_batched_tokens=BATCH * 512,
                      kv_capacity_slots=BATCH * 2048, swap_space_gib=0.0)
    system = SystemSpec(name="paged", kind="paged", prefix_caching=prefix_caching, block_size=16)
    manager = build_manager(system, spec.kv_capacity_slots, MODEL, spec, 4096)
    scheduler = Scheduler(manager, spec, seed=0)
    rng = np.random.default_rng(0)
    for i in range(BATCH):
        scheduler.add(SequenceGroup(Request(i, 0.0, unique_prompt(rng, 200), 1500)))
    now = 0.0
    while len(scheduler.running) < BATCH or any(p for p in [scheduler.waiting]):
        plan = scheduler.schedule()
        now += 0.01
        scheduler.postprocess(plan, now)

    def step():
        plan = scheduler.schedule()
        scheduler.postprocess(plan, 1.0)
        return plan

    # bounded rounds: the sequences grow by one token per call and must not finish
    plan = benchmark.pedantic(step, rounds=400, warmup_rounds=20)
    assert len(plan.chunks) == BATCH and plan.num_batched_tokens == BATCH
    assert scheduler.num_preemptions == 0


DEFAULT_SYSTEMS = ("paged", "max", "pow2", "oracle")


@pytest.fixture(scope="module")
def docqa():
    return PreparedRun("workload=docqa")


@pytest.mark.parametrize("system", DEFAULT_SYSTEMS)
def bench_simulate_docqa(benchmark, docqa, system):
    """One call: the default docqa workload (400 requests) through one system, with the
    full per-step memory accounting (no files written)."""
    run = benchmark.pedantic(docqa.run, args=(system,), rounds=3, warmup_rounds=1)
    assert run.complete
    benchmark.extra_info["steps"] = len(run.recorder.steps["step"])
    benchmark.extra_info["requests"] = len(docqa.workload.requests)


AZURE_CONV = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = TRACES / "mooncake_fast25_conversation" / "conversation_trace.jsonl"


@pytest.fixture(scope="module")
def azure_conv():
    if not AZURE_CONV.exists():
        pytest.skip(f"{AZURE_CONV} not present")
    return PreparedRun("workload=azure_conv", f"workload.path={AZURE_CONV}")


@pytest.mark.trace
@pytest.mark.parametrize("system", DEFAULT_SYSTEMS)
def bench_simulate_azure_conv(benchmark, azure_conv, system):
    """One call: the whole Azure 2023 conversation trace (19,366 requests, ~1 h) through one
    system on the sim executor."""
    run = benchmark.pedantic(azure_conv.run, args=(system,), rounds=1, iterations=1)
    assert run.complete
    benchmark.extra_info["steps"] = len(run.recorder.steps["step"])
    benchmark.extra_info["requests"] = len(azure_conv.workload.requests)


@pytest.fixture(scope="module")
def mooncake():
    if not MOONCAKE.exists():
        pytest.skip(f"{MOONCAKE} not present")
    return PreparedRun("workload=mooncake", f"workload.path={MOONCAKE}", "systems=[paged]")


@pytest.mark.trace
def bench_simulate_mooncake_paged(benchmark, mooncake):
    """One call: the Mooncake conversation trace (12,031 requests) through the paged system
    with prefix caching."""
    run = benchmark.pedantic(mooncake.run, args=("paged",), rounds=1, iterations=1)
    assert run.complete
    benchmark.extra_info["steps"] = len(run.recorder.steps["step"])
