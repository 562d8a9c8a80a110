"""What a run says when it ends: a short summary per system and where its files are.

``print_run_summary(out_dir)`` reads what a run wrote (``results.json`` of a serving run,
``study.json`` of a study, ``kernel_results.json`` of the kernel benchmark) and prints one
line per system (per job of a study): token states %, waste %, requests/s, TTFT p50 and
preemptions, then the load each system was offered against what it served, and the
paths of the results and the report. ``print_sweep_summary`` does the same for a sweep's
finished jobs.

The load figures (``load_figures``) come from results.json alone: the workload's offered
rate ((n - 1) / arrival span) and span, and each system's served rate (finished requests
/ makespan) and drain time (the makespan: when its last request finished). A system whose
offered rate exceeds its served rate, and that takes well past the trace's span to drain
it, spends most of its requests' latency in the queue: ``overload_lines`` says so in
plain words (``overload_lines``), on the console and at the top of the run report.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from pagebench.reports.metrics import waste_pct
from pagebench.reports.serving_metrics import console_lines

# Offered above served by more than this factor, and a drain time this much longer than the
# trace's span: the queue grows through the whole trace (a stable system drains within a
# few requests' latency of its last arrival).
OVERLOAD_RATE_FACTOR = 1.1
OVERLOAD_DRAIN_FACTOR = 1.25

_COLUMNS = ("token states %", "waste %", "req/s", "TTFT p50 (s)", "preemptions", "drain (s)")


def _number(node: Any, *path: str) -> float | None:
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def _cells(summary: dict) -> list[str]:
    """One system's summary line: the figures of ``_COLUMNS``, '-' where not measured."""
    values = (_number(summary, "memory", "token_states_pct"), waste_pct(summary),
              _number(summary, "throughput", "requests_per_s"),
              _number(summary, "latency", "ttft_s", "p50"), _number(summary, "preemptions"),
              _number(summary, "throughput", "makespan_s"))
    formats = ("{:.1f}", "{:.1f}", "{:.2f}", readable_seconds, "{:,.0f}", "{:,.0f}")
    return ["-" if v is None else f(v) if callable(f) else f.format(v)
            for f, v in zip(formats, values)]


def readable_seconds(value: float) -> str:
    """Three significant digits, never an exponent: 2,304 / 23.0 / 0.0312."""
    import math

    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def system_table(rows: list[tuple[str, dict]]) -> list[str]:
    """Aligned lines: a header, then one line per (label, system summary)."""
    table = [["", *_COLUMNS]] + [[label, *_cells(summary)] for label, summary in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
            for row in table]


def load_figures(results: dict, name: str) -> dict[str, float | None]:
    """Offered vs served rate and drain time vs the trace's span of one system of a run."""
    workload = results.get("workload") or {}
    system = (results.get("systems") or {}).get(name) or {}
    hits = _number(system, "prefix_cache", "hit_tokens")
    return {"offered_rps": _number(workload, "mean_rate_rps"),
            "served_rps": _number(system, "throughput", "requests_per_s"),
            "drain_s": _number(system, "throughput", "makespan_s"),
            "span_s": _number(workload, "arrival_span_s"),
            "hit_tokens": hits,
            "readmission_hit_tokens": _number(system, "prefix_cache", "readmission_hit_tokens")}


def is_overloaded(load: dict[str, float | None]) -> bool:
    """Whether requests arrived faster than the system served them for the whole trace."""
    offered, served, drain, span = (load[k] for k in ("offered_rps", "served_rps", "drain_s",
                                                      "span_s"))
    if not (offered and served and drain and span):
        return False  # all at t=0 (offline), or nothing served: no arrival rate to compare
    return offered > OVERLOAD_RATE_FACTOR * served and drain > OVERLOAD_DRAIN_FACTOR * span


def overload_lines(results: dict) -> tuple[str, list[str]] | None:
    """(a plain sentence, one line per overloaded system) when queueing dominates the
    latency of any system of the run (see the module docstring); None otherwise."""
    lines = []
    for name, system in (results.get("systems") or {}).items():
        load = load_figures(results, name)
        if not is_overloaded(load):
            continue
        line = (f"{name}: serves {load['served_rps']:.2f} of the offered "
                f"{load['offered_rps']:.2f} req/s; {load['drain_s']:,.0f} s to drain a "
                f"{load['span_s']:,.0f} s trace")
        ttft = _number(system, "latency", "ttft_s", "p50")
        e2e = _number(system, "latency", "e2e_s", "p50")
        if ttft is not None and e2e is not None:
            line += f"; TTFT p50 {ttft:,.1f} s of an end-to-end p50 of {e2e:,.1f} s"
        hits, readmitted = load["hit_tokens"], load["readmission_hit_tokens"]
        if hits and readmitted and readmitted > 0.5 * hits:
            line += (f"; {readmitted / 1e6:.1f}M of its {hits / 1e6:.1f}M prefix-hit tokens are "
                     "re-admissions after preemption (its own freed blocks), not sharing")
        lines.append(line)
    if not lines:
        return None
    names = ", ".join(line.split(":", 1)[0] for line in lines)
    sentence = (f"Queueing dominates latency: requests arrive faster than {names} "
                f"{'serves' if len(lines) == 1 else 'serve'} them, so the queue grows through the "
                "whole trace and most of a request's latency is waiting. The memory figures "
                "are a saturated server's, the setting of the article's claims (the default "
                "docqa workload saturates on purpose). To measure latency below saturation, "
                "lower the offered load (workload.arrival.rate; workload.arrival.time_scale or "
                "target_rate for a trace) or give the systems more KV memory.")
    return sentence, lines


def serving_summary_lines(results: dict) -> list[str]:
    """A serving run's summary: the system table, the offered load, the overload note."""
    systems = results.get("systems") or {}
    lines = ["summary:", *system_table(list(systems.items()))]
    lines += console_lines(systems)
    workload = results.get("workload") or {}
    offered, span = _number(workload, "mean_rate_rps"), _number(workload, "arrival_span_s")
    if offered is not None and span is not None:
        lines.append(f"  offered load: {offered:.2f} req/s over a {span:,.0f} s trace")
    overload = overload_lines(results)
    if overload is not None:
        lines += [f"note: {overload[0]}", *(f"  {line}" for line in overload[1])]
    return lines


def study_summary_lines(study: dict) -> list[str]:
    """A study's summary: one line per job (sub-run and system)."""
    jobs = [job for job in study.get("jobs") or [] if isinstance(job, dict)]
    rows = [(f"{job.get('key', '?')} {job.get('system', '?')}", job.get("summary") or {})
            for job in jobs]
    return [f"summary of study {study.get('study', '?')} ({len(rows)} jobs):", *system_table(rows)]


def kernel_summary_lines(kernel: dict) -> list[str]:
    """The kernel benchmark's summary: paged / contiguous time per head configuration."""
    where = "CPU: torch's reference paths" if kernel.get("timings") == "cpu" else "GPU kernels"
    lines = [f"summary of the kernel benchmark ({where}):"]
    for head, stats in (kernel.get("summary") or {}).items():
        if not isinstance(stats, dict):
            continue
        ratio = stats.get("paged_over_contiguous") or {}
        share = stats.get("indirection_share") or {}
        text = (f"  {head}: paged / contiguous decode time median "
                f"{_show(ratio.get('median'), '{:.3f}')} (min {_show(ratio.get('min'), '{:.3f}')}"
                f", max {_show(ratio.get('max'), '{:.3f}')}) over {stats.get('points', '?')} points")
        if _number(share, "median") is not None:
            text += f"; indirection share of a decode step median {100 * share['median']:.2f}%"
        lines.append(text)
    return lines


def _show(value: Any, form: str) -> str:
    return form.format(value) if isinstance(value, (int, float)) else "-"


def _paths(out_dir: Path, *names: str) -> list[str]:
    return [f"{name}: {out_dir / name}" for name in names if (out_dir / name).is_file()]


def print_run_summary(out_dir: Path, file: TextIO | None = None) -> None:
    """Print the end-of-run summary of whatever the run in ``out_dir`` wrote."""
    from harness.fileio import read_json

    out_dir, file = Path(out_dir), file or sys.stderr
    if (out_dir / "study.json").is_file():
        lines = study_summary_lines(read_json(out_dir / "study.json"))
        lines += _paths(out_dir, "study.json", "report.html")
    elif (out_dir / "results.json").is_file():
        lines = serving_summary_lines(read_json(out_dir / "results.json"))
        lines += _paths(out_dir, "results.json", "report.html")
    elif (out_dir / "kernel_results.json").is_file():
        lines = kernel_summary_lines(read_json(out_dir / "kernel_results.json"))
        lines += _paths(out_dir, "kernel_results.json", "kernel_results.csv",
                        "kernel_results.md", "report.html")
    else:
        return
    print("\n".join(lines), file=file, flush=True)
    _append_to_log(out_dir / "pagebench.log", lines)


def _append_to_log(log: Path, lines: list[str]) -> None:
    """The summary in the run's log too (Hydra's ``pagebench.log``, which would otherwise
    hold nothing: the console lines are not log records), when the run has one."""
    if not log.is_file():
        return
    try:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    except OSError:
        pass  # the console has it; a log that cannot be written is not the run's failure


def print_sweep_summary(sweep_dir: Path, jobs: list, file: TextIO | None = None) -> None:
    """Print a sweep's summary: one line per (finished job, system), then its report's
    paths. ``jobs``: ``pagebench.reports.sweep.collect_jobs(sweep_dir)``."""
    done = [job for job in jobs if job.results]
    varied = [key for key in dict.fromkeys(k for job in done for k in job.params)
              if len({str(job.params.get(key)) for job in done}) > 1]  # what the sweep swept
    rows = [(" ".join([job.name, *(f"{k}={job.params.get(k)}" for k in varied), name]), s)
            for job in done for name, s in job.results.get("systems", {}).items()]
    lines = [f"summary of the sweep ({len(done)} of {len(jobs)} jobs with results):",
             *system_table(rows),
             *_paths(Path(sweep_dir), "sweep_results.csv", "sweep_report.html")]
    print("\n".join(lines), file=file or sys.stderr, flush=True)
