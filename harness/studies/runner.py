"""Run many (config, system) jobs of a study in worker processes, without per-job reports.

A study is a set of sub-runs that differ from one base config in a few keys (the
request rate, the block size, the workload). ``run_jobs`` runs each (sub-run,
system) pair as one job through the same pieces as ``harness.run.serve`` (specs, workload,
KV manager, scheduler, sim executor, engine loop, summaries) and returns each job's
``results.json``-style system summary plus a few study-specific extras. Jobs run in
parallel, one per core; rate chains stop a system's sweep soon after it saturates.
"""

from __future__ import annotations

import copy
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any, Callable

import numpy as np

from harness.processes import forking, usable_cpus, worker_pool


def set_path(cfg: dict, dotted: str, value: Any) -> None:
    """``cfg["a"]["b"] = value`` for ``dotted = "a.b"`` (creating mappings on the way)."""
    node = cfg
    keys = dotted.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value


def with_overrides(base: dict, overrides: dict[str, Any]) -> dict:
    """A deep copy of ``base`` with dotted-key ``overrides`` applied."""
    cfg = copy.deepcopy(base)
    for key, value in overrides.items():
        set_path(cfg, key, copy.deepcopy(value))
    return cfg


@dataclass
class Job:
    """One system on one sub-run config. ``key`` names the sub-run (e.g. ``sharegpt/r=1.5``)."""

    key: str
    system: str
    cfg: dict  # plain dict: the whole config of the sub-run
    params: dict = field(default_factory=dict)  # what varies (rate, block size, n...), for the report
    probe_blocks: bool = False  # measure block-level sharing savings (disables fast-forward)
    overrides: dict = field(default_factory=dict)  # dotted keys set on the study's config


class _BlockProbe:
    """Wraps a paged manager; at every ``breakdown`` it also records the logical blocks.

    Logical blocks = sum over device-resident sequences of ceil(tokens / block_size):
    the blocks the sequences would hold without sharing. Physical blocks =
    allocated slots / block_size. Their step-duration-weighted ratio gives the
    PagedAttention paper's saving, 1 - physical / logical blocks (its Fig. 15).
    NOTE: the engine calls ``breakdown`` once per step when fast-forward is off.
    """

    def __init__(self, manager) -> None:
        self._m = manager
        self._live: set[int] = set()
        self.logical_blocks: list[int] = []
        self.physical_blocks: list[int] = []

    def __getattr__(self, name: str):
        return getattr(self._m, name)

    def admit(self, seq_id, *args, **kwargs):
        out = self._m.admit(seq_id, *args, **kwargs)
        if out is not None:
            self._live.add(seq_id)
        return out

    def fork(self, parent_id, child_id, *args, **kwargs):
        out = self._m.fork(parent_id, child_id, *args, **kwargs)
        if out is not None:
            self._live.add(child_id)
        return out

    def free(self, seq_id):
        self._live.discard(seq_id)
        return self._m.free(seq_id)

    def breakdown(self, memory_blocked: bool):
        memory = self._m.breakdown(memory_blocked)
        bs = self._m.block_size
        m = self._m
        logical = sum(-(-m.num_tokens(s) // bs) for s in self._live if not m.is_swapped(s))
        self.logical_blocks.append(logical)
        self.physical_blocks.append(memory.allocated_slots // bs)
        return memory


def run_job(job: Job) -> dict:
    """Run one job in this process: the system summary plus study extras."""
    from dataclasses import replace

    from harness.config.specs import kv_capacity_slots
    from harness.engine.engine import run_engine
    from harness.engine.executors import make_executor
    from harness.engine.scheduler import Scheduler
    from harness.run.serve import _system_summary
    from harness.run.run_setup import run_setup
    from harness.config.systems import build_manager
    from harness.workloads import build_workload

    cpu_start = time.process_time()
    cfg = job.cfg
    setup = run_setup(cfg, [job.system])
    model, hardware, engine, seed = setup.model, setup.hardware, setup.engine, setup.seed
    if job.probe_blocks:
        engine = replace(engine, fast_forward=False)
    max_model_len, (system,) = setup.max_model_len, setup.systems
    capacity = kv_capacity_slots(model, hardware, engine)
    workload = build_workload(cfg["workload"], seed=seed, max_model_len=max_model_len)

    manager = build_manager(system, capacity, model, engine, max_model_len)
    probe = _BlockProbe(manager) if job.probe_blocks and system.kind == "paged" else None
    scheduler = Scheduler(probe or manager, engine, seed=seed)
    executor = make_executor(engine, system, model, hardware, manager, seed=seed)
    start = time.perf_counter()
    run = run_engine(workload.requests, scheduler, executor, engine, max_model_len=max_model_len)
    if hasattr(executor, "cost_report"):  # sim: seconds per phase, profiles, ranges
        run.recorder.add_columns(executor.phase_columns())
        run.cost_model = executor.cost_report()
    steps = run.recorder.step_table()
    summary = _system_summary(system, run, steps, run.recorder.request_table(), model, setup.slo)
    duration = steps["duration_s"].to_numpy(dtype=float)
    total = float(duration.sum()) or 1.0
    waiting = steps["num_waiting"].to_numpy() > 0
    extras: dict[str, Any] = {
        # the mean batch over iterations (vLLM's and the paper's "batched requests")
        "mean_batch_per_step": float(steps["num_seqs"].mean()) if len(steps) else 0.0,
        # share of simulated time during which some request waited to be admitted
        "waiting_time_share": float(duration[waiting].sum() / total),
        # the batch a system holds when admission is the limit (some request waits)
        "mean_batch_while_waiting": float(steps["num_seqs"][waiting].mean()) if waiting.any() else None,
        "num_requests": len(workload.requests),
        "workload_summary": {k: workload.summary[k] for k in
                             ("num_requests", "prompt_len", "output_len", "mean_rate_rps",
                              "arrival_span_s")},
        "wall_time_s": round(time.perf_counter() - start, 3),
        "cpu_time_s": round(time.process_time() - cpu_start, 3),
    }
    if probe is not None and probe.logical_blocks:
        if len(probe.logical_blocks) != len(steps):  # pragma: no cover - engine contract changed
            raise RuntimeError("block probe: one breakdown per step expected (fast-forward off)")
        logical = float(np.dot(probe.logical_blocks, duration))
        physical = float(np.dot(probe.physical_blocks, duration))
        extras["block_sharing_savings_pct"] = 100.0 * (1.0 - physical / logical) if logical else 0.0
    summary["study"] = extras
    return summary


@dataclass
class Chain:
    """Jobs of one system over ascending rates; stop ``extra_after_stop`` jobs after ``stop(summary)``."""

    jobs: list[Job]
    stop: Callable[[dict], bool] | None = None
    extra_after_stop: int = 1


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_chains(chains: list[Chain], workers: int | None = None,
               label: Callable[[Job, dict], str] | None = None) -> list[tuple[Job, dict]]:
    """Run every chain's jobs in order, chains in parallel; a chain ends early once it saturates.

    Returns ``(job, summary)`` for every job that ran, in chain order.
    """
    workers = workers or usable_cpus()
    total = sum(len(c.jobs) for c in chains)
    done: list[list[tuple[Job, dict]]] = [[] for _ in chains]
    position = [0] * len(chains)
    remaining_after_stop: list[int | None] = [None] * len(chains)
    started = time.perf_counter()
    count = 0

    def next_job(i: int) -> Job | None:
        chain = chains[i]
        if position[i] >= len(chain.jobs) or remaining_after_stop[i] == 0:
            return None
        job = chain.jobs[position[i]]
        position[i] += 1
        return job

    def record(i: int, job: Job, summary: dict) -> None:
        nonlocal count
        count += 1
        done[i].append((job, summary))
        chain = chains[i]
        if remaining_after_stop[i] is not None:
            remaining_after_stop[i] -= 1
        elif chain.stop is not None and chain.stop(summary):
            remaining_after_stop[i] = chain.extra_after_stop
        text = label(job, summary) if label else ""
        _log(f"  [{count}/{total}] {job.key} {job.system}: {text} "
             f"({summary['study']['wall_time_s']:.1f} s; {time.perf_counter() - started:.0f} s elapsed)")

    if workers <= 1:
        for i in range(len(chains)):
            while (job := next_job(i)) is not None:
                record(i, job, run_job(job))
    else:
        # NOTE: fork keeps the parent's imports; each worker runs one job at a time. The
        # workers start at the first submit (inside forking()).
        pool = worker_pool(workers, get_context("fork"))  # (workers end with this process)
        with forking(), pool:
            running = {}
            # longest chains first, so the slowest work starts early
            order = sorted(range(len(chains)), key=lambda i: -_chain_weight(chains[i]))
            idle_chains = list(order)
            while idle_chains or running:
                while idle_chains and len(running) < workers:
                    i = idle_chains.pop(0)
                    job = next_job(i)
                    if job is not None:
                        running[pool.submit(run_job, job)] = (i, job)
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    i, job = running.pop(future)
                    record(i, job, future.result())
                    idle_chains.insert(0, i)  # keep a started chain going
    return [pair for chain_done in done for pair in chain_done]


def _chain_weight(chain: Chain) -> float:
    """A rough cost estimate: requests x output tokens, summed over the chain."""
    weight = 0.0
    for job in chain.jobs:
        w = job.cfg.get("workload", {})
        n = w.get("num_requests") or 1
        out = (w.get("output") or {}).get("mean") or 100
        weight += n * out * (2.0 if job.system.startswith("paged") else 1.0)
    return weight

