"""How the simulator's cost scales: linear in requests, flat in KV pool capacity.

A steady synthetic workload (ShareGPT-like lengths, Poisson arrivals at a fixed rate, so
16x the requests is 16x the simulated time at the same load) through the paged system
with prefix caching, full per-step memory accounting, no files written. Compare the
medians across the parametrisations: 4x / 16x the requests should cost about 4x / 16x,
and 4x / 16x the pool (unsaturated, so the schedule is the same) about the same.
"""

from __future__ import annotations

import pytest

from _setup import PreparedRun

RATE = 4.0  # requests/s: below what the default paged system sustains (not memory-bound)
BASE_REQUESTS = 1000
BASE_CAPACITY = 65536  # KV slots (llama-2-13b on a100-80gb derives ~60K)


def _prepared(num_requests: int, capacity: int) -> PreparedRun:
    return PreparedRun("workload=sharegpt_like", f"workload.num_requests={num_requests}",
                       f"workload.arrival.rate={RATE}", f"engine.kv_capacity_slots={capacity}",
                       "systems=[paged]")


@pytest.mark.parametrize("scale", [1, 4, 16], ids=["1x", "4x", "16x"])
def bench_sim_requests_scaling(benchmark, scale):
    """One call: BASE_REQUESTS * scale requests through the paged system."""
    prepared = _prepared(BASE_REQUESTS * scale, BASE_CAPACITY)
    run = benchmark.pedantic(prepared.run, args=("paged",), rounds=3 if scale < 16 else 1,
                             iterations=1, warmup_rounds=1 if scale == 1 else 0)
    assert run.complete
    benchmark.extra_info["requests"] = len(prepared.workload.requests)
    benchmark.extra_info["steps"] = len(run.recorder.steps["step"])


@pytest.mark.parametrize("scale", [1, 4, 16], ids=["1x", "4x", "16x"])
def bench_sim_capacity_scaling(benchmark, scale):
    """One call: BASE_REQUESTS requests through the paged system over BASE_CAPACITY * scale
    KV slots (same schedule: the workload never fills the smallest pool)."""
    prepared = _prepared(BASE_REQUESTS, BASE_CAPACITY * scale)
    run = benchmark.pedantic(prepared.run, args=("paged",), rounds=3, iterations=1,
                             warmup_rounds=1)
    assert run.complete
    steps = run.recorder.step_table()
    assert (steps["num_preempted"] == 0).all()
    benchmark.extra_info["capacity_slots"] = BASE_CAPACITY * scale
    benchmark.extra_info["steps"] = len(steps)
