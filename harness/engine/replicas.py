"""Replicas: ``engine.replicas`` independent engines behind a router that dispatches each
request at its arrival (``engine.router``), their results merged.

* ``round_robin``: the i-th request (arrival order) goes to replica i mod R. The split is
  known up front, so each replica runs the whole engine loop (fast-forward included) on
  its share.
* ``least_outstanding``: a request goes to the replica with the fewest outstanding
  requests (dispatched, not finished by the arrival; ties: the lowest index). The split
  depends on when each replica finishes its requests, so the replicas advance together:
  before each arrival every replica runs the steps that start before it (a step that ends
  later finishes nothing earlier), step by step. A request arriving at the end of a step
  that finishes another sees that one finished, as a single engine admits it after the
  step's postprocess.

Merged (``merge_runs``): the request tables pooled (a ``replica`` column says which ran
each), the step tables concatenated in time order (a ``replica`` column), counters summed;
throughput over the pooled requests is the replicas' sum, latencies are pooled.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from dataclasses import dataclass, field

import pandas as pd

from harness.config.specs import EngineSpec
from harness.engine.engine import (EngineRun, EngineStalled, _request_row, _tokens_digest,
                                   rejection_reason, run_engine)
from harness.engine.sequence import SequenceGroup
from harness.metrics.summaries import RunRecorder
from harness.workloads.request import Request


def round_robin(requests: tuple[Request, ...], replicas: int) -> list[int]:
    """The replica of each request: i mod ``replicas`` in arrival order."""
    return [i % replicas for i in range(len(requests))]


@dataclass
class _Replica:
    """One engine advanced step by step between arrivals (the engine loop without
    fast-forward, ``harness.engine.engine._run_engine``)."""

    scheduler: object
    executor: object
    spec: EngineSpec
    max_model_len: int
    recorder: RunRecorder = None
    now: float = 0.0
    pending: deque = field(default_factory=deque)
    groups: dict = field(default_factory=dict)
    digests: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)
    finish_times: list = field(default_factory=list)  # of its finished requests, in order
    dispatched: int = 0

    def __post_init__(self) -> None:
        self.recorder = RunRecorder(self.scheduler.manager.capacity_slots)

    def dispatch(self, request: Request) -> None:
        self.dispatched += 1
        reason = rejection_reason(request, self.scheduler, self.spec, self.max_model_len)
        if reason is not None:  # never outstanding
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
            self.recorder.record_request(_request_row(request, None, "rejected"))
            self.finish_times.append(request.arrival_time)
            return
        self.pending.append(request)

    def outstanding(self, at: float) -> int:
        return self.dispatched - sum(1 for t in self.finish_times if t <= at)

    def advance(self, horizon: float) -> None:
        """Run every step that starts before ``horizon``."""
        scheduler = self.scheduler
        while True:
            while self.pending and self.pending[0].arrival_time <= self.now:
                group = SequenceGroup(self.pending.popleft())
                self.groups[group.request.request_id] = group
                scheduler.add(group)
            if not scheduler.has_work():
                if not self.pending or self.pending[0].arrival_time >= horizon:
                    return
                self.now = max(self.now, self.pending[0].arrival_time)
                continue
            if self.now >= horizon:
                return
            scheduler.step_start = self.now
            plan = scheduler.schedule()
            if plan.is_empty:
                if self.pending and not scheduler.running:
                    if self.pending[0].arrival_time >= horizon:
                        return
                    self.now = max(self.now, self.pending[0].arrival_time)
                    continue
                raise EngineStalled(f"no step can run at t={self.now:.3f}s on a replica: raise "
                                    "engine.kv_capacity_slots, max_num_batched_tokens or max_num_seqs")
            duration, sampled = self.executor.execute(plan)
            start = self.now
            self.now += duration
            memory = scheduler.manager.breakdown(plan.memory_blocked)
            for group in scheduler.postprocess(plan, self.now, sampled):
                self.recorder.record_request(_request_row(group.request, group, "finished"))
                if group.token_breaks:
                    self.recorder.token_breaks[group.request.request_id] = group.token_breaks
                self.digests[group.request.request_id] = _tokens_digest(group)
                self.groups.pop(group.request.request_id, None)
                self.finish_times.append(self.now)
            self.recorder.record_step(start, duration, plan.num_seqs, plan.num_batched_tokens,
                                      plan.num_prefill_tokens, len(scheduler.waiting),
                                      plan.num_preempted, memory)

    def finish(self, wall_s: float) -> EngineRun:
        for group in self.groups.values():
            self.recorder.record_request(_request_row(group.request, group, "unfinished"))
        digest = hashlib.sha256()
        for request_id in sorted(self.digests):
            digest.update(self.digests[request_id])
        return EngineRun(self.recorder, self.scheduler, wall_s, True, None, self.rejected,
                         digest.hexdigest())


def least_outstanding(requests: tuple[Request, ...], engines: list[tuple], spec: EngineSpec,
                      max_model_len: int) -> tuple[list[EngineRun], list[int]]:
    """Co-simulate ``engines`` ((scheduler, executor) pairs) under the least-outstanding
    router; their runs and each request's replica."""
    start = time.perf_counter()
    replicas = [_Replica(s, e, spec, max_model_len) for s, e in engines]
    chosen = []
    for request in requests:
        for replica in replicas:
            replica.advance(request.arrival_time)
        loads = [r.outstanding(request.arrival_time) for r in replicas]
        target = loads.index(min(loads))
        chosen.append(target)
        replicas[target].dispatch(request)
    for replica in replicas:
        replica.advance(float("inf"))
    wall = time.perf_counter() - start
    return [r.finish(wall) for r in replicas], chosen


def run_replicas(requests: tuple[Request, ...], engines: list[tuple], spec: EngineSpec,
                 max_model_len: int, stop_requested=None) -> tuple[list[EngineRun], list[int]]:
    """The replicas' runs under ``spec.router`` and each request's replica."""
    if spec.router == "least_outstanding":
        return least_outstanding(requests, engines, spec, max_model_len)
    chosen = round_robin(requests, len(engines))
    runs = []
    for index, (scheduler, executor) in enumerate(engines):
        share = tuple(r for r, c in zip(requests, chosen) if c == index)
        runs.append(run_engine(share, scheduler, executor, spec, max_model_len=max_model_len,
                               stop_requested=stop_requested))
    return runs, chosen


class MergedRecorder:
    """The replicas' tables as one run's (``RunRecorder``'s read side)."""

    def __init__(self, runs: list[EngineRun], chosen: list[int], requests: tuple[Request, ...]):
        steps = []
        for index, run in enumerate(runs):
            table = run.recorder.step_table()
            table.insert(1, "replica", index)
            steps.append(table)
        merged = pd.concat(steps, ignore_index=True).sort_values(["time_s", "replica"], kind="stable")
        merged["step"] = range(len(merged))
        self._steps = merged.reset_index(drop=True)
        table = pd.concat([run.recorder.request_table() for run in runs], ignore_index=True)
        replica_of = {r.request_id: c for r, c in zip(requests, chosen)}
        table.insert(1, "replica", table["request_id"].map(replica_of))
        self._requests = table.sort_values("request_id", kind="stable").reset_index(drop=True)
        # request id -> its token breaks (harness.metrics.latency): ids are unique across replicas
        self.token_breaks = {k: v for run in runs for k, v in run.recorder.token_breaks.items()}

    def step_table(self) -> pd.DataFrame:
        return self._steps

    def request_table(self) -> pd.DataFrame:
        return self._requests


@dataclass
class ReplicaCounters:
    """The scheduler figures a run's summary reads, summed over the replicas; ``manager``
    is the first replica's (every replica's pool is the same size)."""

    manager: object
    num_preemptions: int
    num_swaps: int
    prompt_tokens_queried: int
    prompt_tokens_cached: int
    readmission_tokens_cached: int
    swap_allowed: bool
    swap_fallbacks: dict

    @classmethod
    def of(cls, runs: list[EngineRun]) -> "ReplicaCounters":
        schedulers = [run.scheduler for run in runs]
        fallbacks: dict = {}
        for s in schedulers:
            for key, value in s.swap_fallbacks.items():
                fallbacks[key] = fallbacks.get(key, 0) + value
        return cls(schedulers[0].manager, *(sum(getattr(s, key) for s in schedulers) for key in (
            "num_preemptions", "num_swaps", "prompt_tokens_queried", "prompt_tokens_cached",
            "readmission_tokens_cached")), schedulers[0].swap_allowed, fallbacks)


def merge_runs(runs: list[EngineRun], chosen: list[int], requests: tuple[Request, ...]) -> EngineRun:
    """One ``EngineRun`` of the replicas' (see the module docstring)."""
    digest = hashlib.sha256()
    for run in runs:
        digest.update(run.output_digest.encode())
    rejected: dict = {}
    for run in runs:
        for key, value in run.rejected.items():
            rejected[key] = rejected.get(key, 0) + value
    stopped = next((run.stop_reason for run in runs if run.stop_reason), None)
    return EngineRun(MergedRecorder(runs, chosen, requests), ReplicaCounters.of(runs),
                     sum(run.wall_time_s for run in runs), all(run.complete for run in runs),
                     stopped, rejected, digest.hexdigest())


def run_replicated(system, requests: tuple[Request, ...], model, hardware, engine: EngineSpec,
                   capacity: int, max_model_len: int, seed: int, stop_requested=None) -> EngineRun:
    """``system`` on ``engine.replicas`` engines of ``capacity`` slots each behind
    ``engine.router``: one merged run, with each replica's phase columns and the summed
    cost report of the sim executors."""
    from harness.config.systems import build_manager
    from harness.engine.executors import make_executor
    from harness.engine.scheduler import Scheduler

    engines, executors = [], []
    for _ in range(engine.replicas):
        manager = build_manager(system, capacity, model, engine, max_model_len)
        executor = make_executor(engine, system, model, hardware, manager, seed=seed,
                                 max_model_len=max_model_len)
        engines.append((Scheduler(manager, engine, seed=seed), executor))
        executors.append(executor)
    runs, chosen = run_replicas(requests, engines, engine, max_model_len, stop_requested)
    for run, executor in zip(runs, executors):
        run.recorder.add_columns(executor.phase_columns())
    merged = merge_runs(runs, chosen, requests)
    report = executors[0].cost_report()
    if "decode_read_slots" in report:
        report["decode_read_slots"] = sum(e.decode_read_slots for e in executors)
    merged.cost_model = report
    merged.replica_managers = [scheduler.manager for scheduler, _ in engines]
    return merged
