"""Replicas behind a router: the dispatch against a hand trace, each replica's run equal
to a single engine's on its share, and the merged tables."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from engine_helpers import HARDWARE, MODEL, engine_spec, make_requests, paged, run
from harness.config.systems import build_manager
from harness.engine.executors import make_executor
from harness.engine.replicas import least_outstanding, merge_runs, round_robin, run_replicas
from harness.engine.scheduler import Scheduler


def _engines(spec, count: int = 2, system=None):
    system = system or paged(16)
    out = []
    for _ in range(count):
        manager = build_manager(system, spec.kv_capacity_slots, MODEL, spec, 4096)
        out.append((Scheduler(manager, spec), make_executor(spec, system, MODEL, HARDWARE, manager)))
    return out


def _trace(at_finish: bool):
    """A (long) and B (one token) at t = 0; C when B has finished (at its finish time, or
    1 ms later) while A still decodes; D with C."""
    spec = engine_spec(kv_capacity_slots=4096, fast_forward=False)
    a, b = make_requests([(64, 400), (64, 1)], gap=0.0)
    alone = run((b,), paged(16), spec).recorder.request_table()
    b_done = float(alone["finish_s"][0])  # B's replica runs nothing else before C arrives
    c_time = b_done if at_finish else b_done + 1e-3
    c, d = make_requests([(64, 8), (64, 8)], gap=0.0, seed=1)
    c = dataclasses.replace(c, request_id=2, arrival_time=c_time)
    d = dataclasses.replace(d, request_id=3, arrival_time=c_time)
    return spec, (a, b, c, d)


@pytest.mark.parametrize("at_finish", [False, True])
def test_least_outstanding_sends_the_next_request_where_one_finished(at_finish):
    spec, requests = _trace(at_finish)
    # at C's arrival: replica 0 still runs A (1 outstanding), replica 1 finished B (0): C
    # goes to 1; then both have 1: D goes to the lower index, 0
    runs, chosen = least_outstanding(requests, _engines(spec), spec, 4096)
    assert chosen == [0, 1, 1, 0]
    assert round_robin(requests, 2) == [0, 1, 0, 1]
    merged = merge_runs(runs, chosen, requests).recorder.request_table()
    assert merged["replica"].tolist() == [0, 1, 1, 0]
    assert (merged["status"] == "finished").all()


@pytest.mark.parametrize("router", ["least_outstanding", "round_robin"])
def test_each_replica_runs_as_a_single_engine_on_its_share(router):
    requests = make_requests([(40 + 7 * i % 90, 5 + 13 * i % 120) for i in range(40)], gap=0.01)
    spec = engine_spec(kv_capacity_slots=2048, fast_forward=False, router=router, replicas=3)
    runs, chosen = run_replicas(requests, _engines(spec, 3), spec, 4096)
    assert sorted(set(chosen)) == [0, 1, 2]
    for index, replica_run in enumerate(runs):
        share = tuple(r for r, c in zip(requests, chosen) if c == index)
        alone = run(share, paged(16), spec)
        pd.testing.assert_frame_equal(replica_run.recorder.step_table(),
                                      alone.recorder.step_table(), check_exact=True)
        pd.testing.assert_frame_equal(replica_run.recorder.request_table(),
                                      alone.recorder.request_table(), check_exact=True)


def test_the_merged_run_pools_requests_and_orders_steps_in_time():
    requests = make_requests([(50, 30)] * 10, gap=0.05)
    spec = engine_spec(kv_capacity_slots=2048, replicas=2)
    runs, chosen = run_replicas(requests, _engines(spec), spec, 4096)
    merged = merge_runs(runs, chosen, requests)
    steps, reqs = merged.recorder.step_table(), merged.recorder.request_table()
    assert len(steps) == sum(len(r.recorder.step_table()) for r in runs)
    assert steps["time_s"].is_monotonic_increasing and steps["step"].tolist() == list(range(len(steps)))
    assert reqs["request_id"].tolist() == list(range(10)) and reqs["replica"].tolist() == [0, 1] * 5
    assert merged.scheduler.num_preemptions == sum(r.scheduler.num_preemptions for r in runs)


def test_a_run_with_replicas_reports_its_gpus_and_each_request_replica(run_cli, tmp_path):
    import json
    result = run_cli(tmp_path, "engine.replicas=2", "engine.router=least_outstanding",
                     "workload.num_requests=30", "report=false", "progress=false", "jobs=1",
                     "systems=[paged]")
    assert result.returncode == 0, result.output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["parallelism"]["gpus"] == 2 and results["parallelism"]["router"] == "least_outstanding"
    table = pd.read_csv(tmp_path / "requests_paged.csv")
    assert set(table["replica"]) == {0, 1}
    assert results["systems"]["paged"]["kv_residency"]["kv_block_lifetime_seconds"]["count"] > 0
    assert results["systems"]["paged"]["serving"]["mean_itl_ms"] > 0  # ITL: each replica's steps


@pytest.mark.parametrize("args, message", [
    (["engine=torch", "model=tiny", "hardware=cpu", "engine.replicas=2"],
     "engine.replicas=2: the torch executor runs one engine"),
    (["engine.replicas=2", "engine.offload.cpu_gib=1", "systems=[paged]"],
     "engine.replicas=2: the offload tiers are modelled for one engine"),
    (["engine.router=random"], "engine.router: must be one of round_robin, least_outstanding"),
])
def test_replica_settings_that_cannot_run_are_refused(run_cli, tmp_path, args, message):
    result = run_cli(tmp_path, *args, "workload.num_requests=4", "progress=false")
    assert result.returncode == 2 and message in result.output
