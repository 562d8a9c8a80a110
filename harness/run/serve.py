"""One run: compose the specs, run every system on one workload, write everything.

On the sim executor the systems are independent simulations, so ``jobs`` of them run
at once in worker processes; the results are byte-identical to running them one
after the other.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import gc
import multiprocessing
import pickle
import platform
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd

from harness import __version__
from harness.config.specs import (EngineSpec, HardwareSpec, ModelSpec, SloSpec, SystemSpec, check_run_options,
                            kv_capacity_slots, wants_report)
from harness.engine.engine import EngineRun, run_engine
from harness.engine.scheduler import Scheduler
from harness.run.huge_pages import without_huge_pages
from harness.engine.executors import executor_capacity_slots, make_executor
from harness.engine.fit_range import extrapolation_warnings
from harness.errors import ConfigError, did_you_mean
from harness.metrics.latency import serving_metrics
from harness.metrics.residency import residency_summary
from harness.metrics.summaries import layer_group_summary, memory_summary, serving_summary
from harness.config.parallelism import degree, gpu_memory
from harness.metrics.offload import offload_figures, offload_summary
from harness.processes import fork_is_safe, forking, usable_cpus, worker_pool
from harness.run.progress import ParallelBars, publish, shared_progress
from harness.run.reuse import reuse_earlier
from harness.run.interrupts import STOP_SIGNALS, InterruptFlag, deferred_interrupt
from harness.run.rejections import SERVED_NOTHING, rejection_warnings, systems_that_served_nothing
from harness.fileio import write_json
from harness.results_format import SCHEMA_VERSION
from harness.run.job_identity import config_hash
from harness.run.results import write_table
from harness.run.run_setup import RunSetup, check_block_sizes, run_setup
from harness.config.memory_estimate import check_pools_fit
from harness.config.systems import build_manager, cpu_pool_slots

if TYPE_CHECKING:
    from harness.workloads import Workload

TOP_LEVEL_KEYS = {"workload", "model", "hardware", "engine", "allocator", "run", "block_size",
                  "seed", "systems", "progress", "jobs", "report", "kernel_bench", "experiment",
                  "slo"}
# How often the parent looks for Ctrl-C while worker processes run.
_POLL_S = 0.2


def check_top_level(cfg: Any) -> None:
    unknown = sorted(set(cfg.keys()) - TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown top-level key.{did_you_mean(unknown[0], TOP_LEVEL_KEYS)}"
                          f" Valid keys: {', '.join(sorted(TOP_LEVEL_KEYS))}")


def resolve_jobs(value: Any, executor: str, num_systems: int) -> int:
    """How many systems run at once: ``jobs`` ("auto" or a positive integer), at most one
    per system; always 1 on the torch executor, which owns the device."""
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"jobs: must be a positive integer or 'auto' (one process per system, "
                          f"up to the number of cores), got {value!r}")
    if executor != "sim":
        return 1
    if value == "auto":
        value = usable_cpus()
    return min(value, num_systems)


@dataclass(frozen=True)
class RunContext:
    """What every system of a run shares; a worker process receives it once."""

    workload: Workload
    model: ModelSpec
    hardware: HardwareSpec
    engine: EngineSpec
    capacity: int
    max_model_len: int
    seed: int
    out_dir: Path
    slo: SloSpec = SloSpec()


@dataclass
class SystemOutcome:
    """One system's run once its tables are written: what results.json and run_info.json
    need, small and picklable (no live scheduler)."""

    system: SystemSpec
    summary: dict
    num_steps: int
    wall_time_s: float
    telemetry_rows: list[dict]

    def run_info(self) -> dict:
        """The system's entry in run_info.json."""
        wall = self.wall_time_s
        return {"wall_time_s": round(wall, 3),
                "steps_per_s": round(self.num_steps / wall, 1) if wall else None}


def prepare_serving(cfg: Any) -> tuple[RunSetup, int]:
    """Every check of a serving run's config that does no work: its specs
    (``run_setup``), the top-level keys, ``run`` and ``progress``, ``jobs`` and, on the sim
    executor, that each block fits the pool. ``python -m harness`` calls it before it sets
    an earlier run's outputs aside. Returns (the specs, how many systems run at once)."""
    check_top_level(cfg)
    check_run_options(cfg)  # run: a known mode; progress: a boolean
    setup = run_setup(cfg)
    engine = setup.engine
    jobs = resolve_jobs(cfg.get("jobs", "auto"), engine.executor, len(setup.systems))
    if engine.executor == "sim":  # the torch executor measures its pool on the device
        capacity = kv_capacity_slots(setup.model, setup.hardware, engine)
        check_block_sizes(setup.systems, capacity)
        check_pools_fit(setup.systems, capacity, cpu_pool_slots(setup.model, engine),
                        setup.max_model_len, setup.model, engine, jobs)  # 10^9 blocks: not OOM-killed
    return setup, jobs


def run_serving(cfg: Any, out_dir: Path, prepared: tuple[RunSetup, int] | None = None) -> dict:
    """Run the configured systems on the workload (``jobs`` of them at once); write
    results.json, tables, report. ``prepared``: what ``prepare_serving(cfg)`` returned, when
    the caller has checked the config already (``python -m harness``)."""
    from harness.workloads import build_workload

    setup, jobs = prepared if prepared is not None else prepare_serving(cfg)
    model, hardware, engine = setup.model, setup.hardware, setup.engine
    block_size, seed, max_model_len, systems = (setup.block_size, setup.seed,
                                                setup.max_model_len, setup.systems)
    full = setup.full_model or model  # model: one GPU's shard (tensor parallelism)
    report = wants_report(cfg)
    # torch: from the real device (weights + profiled activations); sim: the hardware profile
    capacity = executor_capacity_slots(model, hardware, engine, max_model_len=max_model_len,
                                       seed=seed)
    check_block_sizes(systems, capacity)

    workload = build_workload(cfg.workload, seed=seed, max_model_len=max_model_len)
    context = RunContext(workload, model, hardware, engine, capacity, max_model_len, seed, out_dir,
                         setup.slo)
    show_progress = bool(cfg.get("progress", True))
    print(f"pagebench {__version__}: workload={workload.name} ({len(workload.requests)} requests) "
          f"model={model.name} hardware={hardware.name} executor={engine.executor} capacity={capacity} slots "
          f"({capacity * model.bytes_per_slot / 2**30:.1f} GiB KV"
          f"{' a GPU' if degree(engine) > 1 else ''})"
          f"{f' tensor_parallel={degree(engine)}' if degree(engine) > 1 else ''}"
          f"{f' replicas={engine.replicas}' if engine.replicas > 1 else ''}", file=sys.stderr)
    for line in _workload_notes(workload.summary.get("rows") or {}, max_model_len):
        print(f"note: {line}", file=sys.stderr)

    results: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "pagebench_version": __version__,
        "complete": True,
        "config_hash": config_hash(cfg),
        "executor": engine.executor,
        "seed": seed,
        "block_size": block_size,
        "workload": workload.summary,
        "model": {"name": full.name, "num_params": full.num_params,
                  "bytes_per_slot": full.bytes_per_slot, "max_model_len": max_model_len,
                  "kv_dtype": full.kv_dtype or full.dtype, "active_params": full.active_params,
                  "layer_groups": [group.to_json() for group in full.layer_groups]},
        "hardware": asdict(hardware),
        "capacity_slots": capacity,
        "parallelism": gpu_memory(full, model, hardware, engine, degree(engine), capacity),
        "systems": {},
    }
    run_info: dict[str, Any] = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(),
        "platform": platform.platform(), "jobs": jobs, "systems": {},
    }
    total_start = time.perf_counter()
    outcomes: dict[str, SystemOutcome] = {}

    steps_kind = "simulated" if engine.executor == "sim" else "engine"

    def record(outcome: SystemOutcome) -> None:
        outcomes[outcome.system.name] = outcome
        print(f"  {outcome.system.name}: {outcome.num_steps} steps in {outcome.wall_time_s:.2f} s "
              f"wall ({outcome.run_info()['steps_per_s']} {steps_kind} steps/s)", file=sys.stderr)

    if engine.executor == "sim":  # deterministic: a sibling job's identical system is reused
        results["system_inputs"] = {}
        for system, summary in reuse_earlier(cfg, systems, capacity, out_dir,
                                             results["system_inputs"]):
            outcomes[system.name] = SystemOutcome(system, summary, summary.get("steps", 0), 0.0, [])
    to_run = [system for system in systems if system.name not in outcomes]
    with deferred_interrupt() as interrupt:
        try:
            if jobs == 1 or len(to_run) < 2:
                _run_serial(to_run, context, show_progress, interrupt, record)
            else:
                _run_parallel(to_run, context, jobs, interrupt, record, show_progress)
        except KeyboardInterrupt:  # a second Ctrl-C: keep the systems that finished
            pass
    telemetry_rows = _merge_outcomes(systems, outcomes, results, run_info)
    _report_rejections(results, len(workload.requests), capacity)
    _report_warnings(results, extrapolation_warnings(results["systems"], hardware.name)
                     + swap_fallback_warnings(results["systems"]))
    if engine.executor == "torch":
        _report_outputs(results)
        from harness.engine.token_check import report_tokens

        report_tokens(results, workload.requests, model, engine, seed)  # agreement, teacher-forced
    run_info["wall_time_s"] = round(time.perf_counter() - total_start, 3)
    if telemetry_rows:
        write_table(out_dir / "nvml_samples.csv", pd.DataFrame(telemetry_rows))
    write_json(out_dir / "run_info.json", run_info)
    write_json(out_dir / "results.json", results)  # last: when it is there, the rest is
    if report:
        from pagebench.reports.render import render_run_report

        try:
            render_run_report(out_dir)
        except KeyboardInterrupt:
            again = "the same command again (or " if results["complete"] else "("
            print(f"report.html not drawn; the results are written: {again}python -m pagebench.reports "
                  f"{out_dir}) draws it", file=sys.stderr)
            raise
    print(f"wall time {run_info['wall_time_s']:.2f} s; results in {out_dir}", file=sys.stderr)
    return results



def _merge_outcomes(systems: list[SystemSpec], outcomes: dict[str, SystemOutcome],
                    results: dict, run_info: dict) -> list[dict]:
    """Add the systems that ran to ``results`` and ``run_info`` in configured order, mark an
    interrupted run incomplete; return their NVML telemetry rows."""
    ran = [outcomes[s.name] for s in systems if s.name in outcomes]
    for outcome in ran:
        results["systems"][outcome.system.name] = outcome.summary
        results["complete"] &= outcome.summary["complete"]
        run_info["systems"][outcome.system.name] = outcome.run_info()
    if len(ran) < len(systems) or any(o.summary.get("stop_reason") == "interrupted" for o in ran):
        results["complete"] = False
        results["stop_reason"] = "interrupted"
        print("interrupted: writing what has run, marked incomplete", file=sys.stderr)
    return [dict(row, system=o.system.name) for o in ran for row in o.telemetry_rows]


def _report_rejections(results: dict, num_requests: int, capacity: int) -> None:
    """Warn about requests the systems rejected (console and results.json); a system that
    served none makes the run incomplete."""
    warnings = rejection_warnings(results["systems"], num_requests, capacity)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if warnings:
        results["warnings"] = warnings
    served_nothing = systems_that_served_nothing(results["systems"], num_requests)
    if served_nothing and results.get("stop_reason") != "interrupted":
        results["complete"] = False
        results["stop_reason"] = f"{SERVED_NOTHING} {', '.join(served_nothing)}"


def _report_warnings(results: dict, lines: list[str]) -> None:
    """Print ``lines`` as warnings and add them to results.json's ``warnings``."""
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)
        results.setdefault("warnings", []).append(line)


def swap_fallback_warnings(systems: dict[str, dict]) -> list[str]:
    """One line per system (``results.json``'s ``systems``) that recomputed preemptions
    although ``engine.preemption=swap``, or none."""
    lines = []
    for name, s in systems.items():
        why = s.get("recomputed_instead_of_swap") or {}
        reasons = [text.format(count) for key, text in (
            ("multi_sequence_group", "{:,} of parallel-sampling or beam-search groups, which "
                                     "are never swapped"),
            ("cpu_swap_space_full", "{:,} with the CPU swap space full: raise "
                                    "engine.swap_space_gib"),
            ("manager_does_not_swap", "{:,} because its manager never swaps "
                                      "(no CPU pool: radix, paged_hybrid)")) if (count := why.get(key))]
        if reasons:
            lines.append(f"engine.preemption=swap: {name} recomputed {sum(why.values()):,} of its "
                         f"{s['preemptions']:,} preemptions instead ({'; '.join(reasons)})")
    return lines


def _report_outputs(results: dict) -> None:
    """Real forward passes: say whether every system generated the same tokens (their
    ``output_digest``s agree), on the console and in results.json (``outputs_identical``)."""
    digests = {name: s.get("output_digest") for name, s in results["systems"].items()}
    if len(digests) < 2:
        return
    rejected = any(s["requests"]["rejected"] for s in results["systems"].values())
    same = len(set(digests.values())) == 1
    results["outputs_identical"] = same
    if same:
        print(f"outputs: every system generated the same tokens (output_digest "
              f"{next(iter(digests.values()))[:16]})", file=sys.stderr)
    else:
        listed = ", ".join(f"{name} {digest[:16]}" for name, digest in digests.items())
        why = (" (some systems rejected requests: they served different ones)" if rejected
               else "")
        print(f"warning: the systems generated different tokens: {listed}{why}", file=sys.stderr)


def _run_serial(systems: list[SystemSpec], context: RunContext, show_progress: bool,
                interrupt: InterruptFlag, record: Callable[[SystemOutcome], None]) -> None:
    """Run the systems one after the other in this process; stop at the first Ctrl-C."""
    for system in systems:
        if interrupt.check():
            return
        record(_run_system(system, context, show_progress, interrupt.check))


def _run_parallel(systems: list[SystemSpec], context: RunContext, jobs: int,
                  interrupt: InterruptFlag, record: Callable[[SystemOutcome], None],
                  show_progress: bool = False) -> None:
    """Run the systems in ``jobs`` worker processes, recording each as it finishes; with
    ``show_progress`` the parent draws a bar per system from the workers' shared progress.

    Workers ignore SIGINT and SIGTERM; on either the parent raises a shared stop flag: running
    systems stop after their current step (recorded as interrupted), the others never start.
    """
    print(f"  running {len(systems)} systems in {jobs} processes", file=sys.stderr)
    mp = _pool_context()
    stop = mp.RawValue("b", 0)  # shared memory: a worker reads it after every engine step
    progress = shared_progress(mp, len(systems))  # written by the workers, drawn here
    bars = (ParallelBars([s.name for s in systems], len(context.workload.requests), progress)
            if show_progress and sys.stderr.isatty() else None)  # (bars on a terminal only)
    shared = pickle.dumps(context, protocol=pickle.HIGHEST_PROTOCOL)  # keeps arrays read-only
    with worker_pool(jobs, mp, initializer=_init_worker,
                     initargs=(shared, stop, progress)) as pool:
        try:
            with forking():  # the workers start at the first submit
                pending = {pool.submit(_run_in_worker, system, i) for i, system in enumerate(systems)}
            while pending:
                done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
                if interrupt.check():
                    stop.value = 1
                if bars is not None:
                    bars.refresh()
                for future in done:
                    if (outcome := future.result()) is not None:
                        with bars.printing() if bars is not None else contextlib.nullcontext():
                            record(outcome)
        finally:  # after an error or a second Ctrl-C: stop the other workers, not wait for them
            stop.value = 1
            pool.shutdown(cancel_futures=True)
            if bars is not None:
                bars.close()


def _pool_context() -> multiprocessing.context.BaseContext:
    """fork when it is safe (only this thread, torch not loaded): the workers inherit the
    imports at no cost; otherwise forkserver, which imports this module once."""
    if fork_is_safe():
        return multiprocessing.get_context("fork")
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


_worker_context: RunContext | None = None
_worker_stop: Any = None  # the parent's stop flag (a shared ctypes byte)
_worker_progress: Any = None  # the parent's progress slots (harness.run.progress)


def _init_worker(shared: bytes, stop: Any, progress: Any = None) -> None:
    """Worker start: leave Ctrl-C and SIGTERM to the parent (``scancel`` signals every
    process), unpickle the run's shared context once."""
    global _worker_context, _worker_stop, _worker_progress
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    _worker_context = pickle.loads(shared)
    _worker_stop = stop
    _worker_progress = progress


def _run_in_worker(system: SystemSpec, index: int = 0) -> SystemOutcome | None:
    """Run one system (the run's ``index``-th) in a worker process, publishing its progress;
    None when the run was stopped before it started."""
    if _worker_stop.value:
        return None
    on_progress = (None if _worker_progress is None
                   else functools.partial(publish, _worker_progress, index))
    return _run_system(system, _worker_context, False, _worker_stopped, on_progress)


def _worker_stopped() -> str | None:
    """The engine's stop hook in a worker: "interrupted" once the parent raised the flag."""
    return "interrupted" if _worker_stop.value else None


def _run_system(system: SystemSpec, context: RunContext, show_progress: bool,
                stop_requested: Callable[[], str | None],
                on_progress: Callable[[int, float], None] | None = None) -> SystemOutcome:
    """Run one system, write its step and request tables, reduce the run to its outcome.

    NOTE: the garbage collector is paused from the engine's end until the run is let go:
    the engine leaves some 37,000 young tuples (its request rows and executed steps'
    phases on Azure conv's max run) that the next young collection walks once to find
    nothing, 10-25 ms a system (``gc.callbacks``); the work after the run (phase columns,
    tables, summary) makes no reference cycles.
    """
    c = context
    with contextlib.ExitStack() as after_engine:  # (the collector's pause: _run_one)
        run = _run_one(system, c.workload, c.model, c.hardware, c.engine, c.capacity,
                       c.max_model_len, c.seed, show_progress, stop_requested, on_progress,
                       after_engine)
        steps, requests = run.recorder.step_table(), run.recorder.request_table()
        write_table(c.out_dir / f"steps_{system.name}.csv", steps)
        write_table(c.out_dir / f"requests_{system.name}.csv", requests)
        outcome = SystemOutcome(system, _system_summary(system, run, steps, requests, c.model,
                                                        c.slo),
                                len(steps), run.wall_time_s, run.telemetry_rows)
        del run, steps, requests  # freed before the collector resumes
    return outcome


def _run_one(system: SystemSpec, workload, model: ModelSpec, hardware: HardwareSpec,
             engine: EngineSpec, capacity: int, max_model_len: int, seed: int,
             show_progress: bool, stop_requested=None, on_progress=None,
             after_engine: contextlib.ExitStack | None = None) -> EngineRun:
    """One system's engine run, with the executor's reports and phase columns. With
    ``after_engine``, the garbage collector is paused as the engine returns, until that
    stack ends (``_run_system``'s NOTE)."""
    if engine.replicas > 1:  # (sim only: run_setup refuses replicas on the torch executor)
        from harness.engine.replicas import run_replicated

        return run_replicated(system, workload.requests, model, hardware, engine, capacity,
                              max_model_len, seed, stop_requested)
    manager = build_manager(system, capacity, model, engine, max_model_len)
    scheduler = Scheduler(manager, engine, seed=seed)
    executor = make_executor(engine, system, model, hardware, manager, seed=seed,
                             max_model_len=max_model_len)
    bar = None
    if show_progress and not sys.stderr.isatty():
        # a log file, not a terminal: one plain line (a bar's redraws are hundreds of lines
        # of escape codes there)
        print(f"{system.name:>8}: simulating {len(workload.requests):,} requests",
              file=sys.stderr, flush=True)
    elif show_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(workload.requests), desc=f"{system.name:>8}", unit="req",
                   file=sys.stderr, leave=True, mininterval=0.5)

        clock = "sim" if engine.executor == "sim" else "engine"  # simulated or measured time

        def on_progress(done: int, sim_time: float) -> None:
            bar.n = done
            bar.set_postfix_str(f"{clock} t={sim_time:.0f}s", refresh=False)
            bar.refresh()

    try:
        run = run_engine(workload.requests, scheduler, executor, engine,
                         max_model_len=max_model_len, on_progress=on_progress,
                         stop_requested=stop_requested)
        if after_engine is not None and gc.isenabled():
            gc.disable()  # first: the next allocation would start the collection
            after_engine.callback(gc.enable)
        if hasattr(executor, "report"):  # torch: measured timings, CPU-side costs, NVML
            run.executor_report = executor.report()
            run.telemetry_rows = executor.telemetry_rows()
        if getattr(executor, "fit_range", None) is not None:
            run.fit_range = executor.fit_range.report()
        if hasattr(executor, "cost_report"):  # sim: seconds per phase, profiles, ranges
            with without_huge_pages():  # (its [phases, steps] blocks: _system_summary's NOTE)
                run.recorder.add_columns(executor.phase_columns())
            run.cost_model = executor.cost_report()
        if engine.offload.enabled:  # (check_offload: a paged manager on the sim)
            run.offload = offload_figures(manager, scheduler, engine.offload, system.block_size,
                                          model.bytes_per_slot, executor.offload_load)
        return run
    finally:
        if bar is not None:
            bar.close()
        if hasattr(executor, "close"):
            executor.close()  # free this system's KV memory before the next one allocates


def _workload_notes(rows: dict, max_model_len: int) -> list[str]:
    """Console lines for the requests a workload left out or shortened (``rows`` is its
    summary's tally; results.json keeps it whole)."""
    what = {"skipped": "malformed rows skipped (workload.on_error=skip)",
            "dropped": f"requests dropped: longer than max_model_len={max_model_len} "
                       "(workload.clip=truncate keeps them, shortened)",
            "truncated": f"requests truncated to max_model_len={max_model_len}"}
    notes = []
    for key, text in what.items():
        count = (rows.get(key) or {}).get("total") or 0
        if count:
            notes.append(f"{count:,} {text}")
    return notes


# NOTE: the paged system's ITL figures (800k token gaps on Azure conv: a dozen fresh 6 MB
# temporaries) spent about 0.1 s of kernel time paging in huge pages, varying from run to
# run (the summary's 0.25-0.37 CPU s); without them about 0.01 s (harness.run.huge_pages)
@without_huge_pages()
def _system_summary(system: SystemSpec, run: EngineRun, steps: pd.DataFrame,
                    requests: pd.DataFrame, model: ModelSpec, slo: SloSpec = SloSpec()) -> dict:
    """The system's entry in results.json, from its run and its step and request tables;
    ``serving``: vLLM's serving figures and goodput at ``slo`` (harness.metrics.latency)."""
    scheduler = run.scheduler
    serving = serving_summary(steps, requests)
    serving["serving"] = serving_metrics(steps, requests, slo, run.recorder.token_breaks)
    manager = scheduler.manager
    manager_capacity = manager.capacity_slots
    grouped = manager.capabilities.layer_groups
    queried = scheduler.prompt_tokens_queried
    summary = {
        "label": system.label,
        "allocator": {k: v for k, v in asdict(system).items() if v is not None},
        "memory": memory_summary(steps, manager_capacity),
        # bytes of one slot of its memory figures (capacity_slots x slot_bytes = its pool)
        "slot_bytes": manager.slot_bytes if grouped else model.bytes_per_slot,
        **({"layer_groups": layer_group_summary(manager.layer_group_report(), steps)}
           if grouped else {}),
        **serving,
        "preemptions": scheduler.num_preemptions,
        "swaps": scheduler.num_swaps,
        **({"recomputed_instead_of_swap": dict(scheduler.swap_fallbacks)}
           if scheduler.swap_allowed else {}),
        "prefix_cache": {
            "queried_tokens": queried,
            "hit_tokens": scheduler.prompt_tokens_cached,
            "hit_rate": round(scheduler.prompt_tokens_cached / queried, 6) if queried else None,
            "readmission_hit_tokens": scheduler.readmission_tokens_cached,
        },
        **({"kv_residency": residency_summary(run.replica_managers or [manager])}
           if manager.capabilities.block_residency and manager.pool.residency is not None
           else {}),
        "rejected_reasons": dict(sorted(run.rejected.items())),
        "output_digest": run.output_digest,
        "complete": run.complete,
    }
    summary["sharing_savings_pct"] = summary["memory"]["sharing_savings_pct"]
    if run.executor_report is not None:
        summary["executor"] = run.executor_report
        nvml = run.executor_report.get("nvml", {})
        summary["nvml"] = nvml
        summary["energy_per_token_j"] = nvml.get("energy_per_output_token_j")
    if run.fit_range is not None:
        summary["fit_range"] = run.fit_range
    if run.cost_model is not None:
        summary["cost_model"] = run.cost_model
    if run.offload is not None:
        summary["offload"] = offload_summary(run.offload, steps, requests)
    if run.stop_reason:
        summary["stop_reason"] = run.stop_reason
    return summary
