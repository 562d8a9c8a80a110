"""One run: compose the specs, run every system on one workload, write everything."""

from __future__ import annotations

import datetime as _dt
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness import __version__
from harness.config import (EngineSpec, HardwareSpec, ModelSpec, SystemSpec, build_spec,
                            select_systems, to_plain, validate_block_size)
from harness.engine.engine import EngineRun, run_engine
from harness.engine.scheduler import Scheduler
from harness.engine.executors import executor_capacity_slots, make_executor
from harness.errors import ConfigError
from harness.metrics import memory_summary, serving_summary
from harness.interrupts import deferred_interrupt
from harness.results import SCHEMA_VERSION, config_hash, write_json, write_table
from harness.systems import build_manager

TOP_LEVEL_KEYS = {"workload", "model", "hardware", "engine", "allocator", "run", "block_size",
                  "seed", "systems", "progress", "kernel_bench", "experiment"}


def check_top_level(cfg: Any) -> None:
    unknown = sorted(set(cfg.keys()) - TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown top-level key. Valid keys: "
                          f"{', '.join(sorted(TOP_LEVEL_KEYS))}")


def run_serving(cfg: Any, out_dir: Path) -> dict:
    """Run the configured systems on the workload; write results.json, tables, report."""
    from harness.workloads import build_workload

    check_top_level(cfg)
    model = build_spec(ModelSpec, cfg.model, "model")
    hardware = build_spec(HardwareSpec, cfg.hardware, "hardware")
    engine = build_spec(EngineSpec, cfg.engine, "engine")
    block_size = validate_block_size(cfg.block_size)
    seed = cfg.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed: must be a non-negative integer, got {seed!r}")
    max_model_len = engine.max_model_len or model.max_context
    if max_model_len > model.max_context:
        raise ConfigError(f"engine.max_model_len={max_model_len} exceeds {model.name}'s context "
                          f"of {model.max_context}")
    if not engine.chunked_prefill and engine.max_num_batched_tokens < max_model_len:
        raise ConfigError(
            f"engine.max_num_batched_tokens={engine.max_num_batched_tokens} is below max_model_len="
            f"{max_model_len}, so a long prompt could never be scheduled: raise "
            f"engine.max_num_batched_tokens, lower engine.max_model_len, or set "
            "engine.chunked_prefill=true")
    systems = select_systems(cfg.systems, cfg.allocator, block_size)
    # torch: from the real device (weights + profiled activations); sim: the hardware profile
    capacity = executor_capacity_slots(model, hardware, engine, max_model_len=max_model_len,
                                       seed=seed)
    for system in systems:
        if system.kind == "paged" and capacity // system.block_size < 1:
            raise ConfigError(f"block_size={system.block_size} is larger than the whole KV pool "
                              f"({capacity} slots)")

    workload = build_workload(cfg.workload, seed=seed, max_model_len=max_model_len)
    show_progress = bool(cfg.get("progress", True))
    print(f"pagebench {__version__}: workload={workload.name} ({len(workload.requests)} requests) "
          f"model={model.name} hardware={hardware.name} executor={engine.executor} capacity={capacity} slots "
          f"({capacity * model.bytes_per_slot / 2**30:.1f} GiB KV)", file=sys.stderr)

    results: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "pagebench_version": __version__,
        "complete": True,
        "config_hash": config_hash(cfg),
        "executor": engine.executor,
        "seed": seed,
        "block_size": block_size,
        "workload": workload.summary,
        "model": {"name": model.name, "num_params": model.num_params,
                  "bytes_per_slot": model.bytes_per_slot, "max_model_len": max_model_len},
        "hardware": asdict(hardware),
        "capacity_slots": capacity,
        "systems": {},
    }
    run_info: dict[str, Any] = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(),
        "platform": platform.platform(), "systems": {},
    }
    total_start = time.perf_counter()
    telemetry_rows: list[dict] = []
    with deferred_interrupt() as interrupt:
        try:
            for system in systems:
                run = _run_one(system, workload, model, hardware, engine, capacity, max_model_len,
                               seed, show_progress, interrupt.check)
                results["systems"][system.name] = _system_summary(system, run, capacity)
                telemetry_rows.extend(dict(row, system=system.name) for row in run.telemetry_rows)
                results["complete"] &= run.complete
                steps, requests = run.recorder.step_table(), run.recorder.request_table()
                write_table(out_dir / f"steps_{system.name}.csv", steps)
                write_table(out_dir / f"requests_{system.name}.csv", requests)
                run_info["systems"][system.name] = {
                    "wall_time_s": round(run.wall_time_s, 3),
                    "steps_per_s": round(len(steps) / run.wall_time_s, 1) if run.wall_time_s else None,
                }
                print(f"  {system.name}: {len(steps)} steps in {run.wall_time_s:.2f} s wall "
                      f"({run_info['systems'][system.name]['steps_per_s']} simulated steps/s)",
                      file=sys.stderr)
                if run.stop_reason == "interrupted":
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            results["complete"] = False
            results["stop_reason"] = "interrupted"
            print("interrupted: writing what has run, marked incomplete", file=sys.stderr)
    run_info["wall_time_s"] = round(time.perf_counter() - total_start, 3)
    if telemetry_rows:
        import pandas as pd

        write_table(out_dir / "nvml_samples.csv", pd.DataFrame(telemetry_rows))
    write_json(out_dir / "results.json", results)
    write_json(out_dir / "run_info.json", run_info)
    from reports.render import render_run_report

    render_run_report(out_dir)
    print(f"wall time {run_info['wall_time_s']:.2f} s; results in {out_dir}", file=sys.stderr)
    return results


def _run_one(system: SystemSpec, workload, model: ModelSpec, hardware: HardwareSpec,
             engine: EngineSpec, capacity: int, max_model_len: int, seed: int,
             show_progress: bool, stop_requested=None) -> EngineRun:
    manager = build_manager(system, capacity, model, engine, max_model_len)
    scheduler = Scheduler(manager, engine, seed=seed)
    executor = make_executor(engine, system, model, hardware, manager, seed=seed,
                             max_model_len=max_model_len)
    bar = None
    on_progress = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(workload.requests), desc=f"{system.name:>8}", unit="req",
                   file=sys.stderr, leave=True, mininterval=0.5)

        def on_progress(done: int, sim_time: float) -> None:
            bar.n = done
            bar.set_postfix_str(f"sim t={sim_time:.0f}s", refresh=False)
            bar.refresh()

    try:
        run = run_engine(workload.requests, scheduler, executor, engine,
                         max_model_len=max_model_len, on_progress=on_progress,
                         stop_requested=stop_requested)
        if hasattr(executor, "report"):  # torch: measured timings, CPU-side costs, NVML
            run.executor_report = executor.report()
            run.telemetry_rows = executor.telemetry_rows()
        return run
    finally:
        if bar is not None:
            bar.close()
        if hasattr(executor, "close"):
            executor.close()  # free this system's KV memory before the next one allocates


def _system_summary(system: SystemSpec, run: EngineRun, capacity: int) -> dict:
    steps, requests = run.recorder.step_table(), run.recorder.request_table()
    scheduler = run.scheduler
    serving = serving_summary(steps, requests)
    manager_capacity = scheduler.manager.capacity_slots
    queried = scheduler.prompt_tokens_queried
    summary = {
        "label": system.label,
        "allocator": {k: v for k, v in asdict(system).items() if v is not None},
        "memory": memory_summary(steps, manager_capacity),
        **serving,
        "preemptions": scheduler.num_preemptions,
        "swaps": scheduler.num_swaps,
        "prefix_cache": {
            "queried_tokens": queried,
            "hit_tokens": scheduler.prompt_tokens_cached,
            "hit_rate": round(scheduler.prompt_tokens_cached / queried, 6) if queried else 0.0,
        },
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
    if run.stop_reason:
        summary["stop_reason"] = run.stop_reason
    return summary
