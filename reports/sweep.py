"""The sweep report: every swept parameter against every headline metric, one line per system.

``render_sweep_report(sweep_dir)`` reads a Hydra multirun directory as it is:
each job directory that holds a ``results.json`` contributes its systems' headline
metrics; jobs that failed, stopped early or never started are listed, not dropped.
The expected jobs come from ``multirun.yaml`` (the sweep's own overrides), so a
job that never got a directory is still reported as missing.

Writes ``sweep_report.html`` and ``sweep_results.csv`` at the top of the sweep dir.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml

from harness.errors import InputError
from harness.fileio import atomic_write_text
from harness.results_format import DISPLAY_ONLY_KEYS, PREVIOUS_DIR, next_previous_dir, read_results
from pagebench.reports import figures as F
from pagebench.reports.figure_batch import PendingFigure, resolve
from pagebench.reports.html import absent, esc, page, table
from pagebench.reports.metrics import HEADLINE_METRICS, headline_values

REPORT_NAME = "sweep_report.html"
TABLE_NAME = "sweep_results.csv"
FAILED_MARKER = "job_failed.txt"  # written by pagebench.reports.callbacks when a job raises
FINISHED, INCOMPLETE, FAILED, MISSING = "finished", "incomplete", "failed", "not started"
STOPPED_LABEL = "incomplete job (stopped early: covers part of the run)"
_SKIP_DIRS = {".hydra", ".submitit", "__pycache__", PREVIOUS_DIR}  # previous/: earlier runs set aside


@dataclass
class Job:
    name: str  # the job directory relative to the sweep dir ("3"), or "-" when it never started
    overrides: list[str]
    status: str
    reason: str = ""
    results: dict | None = None
    kernel_results: dict | None = None

    @property
    def params(self) -> dict[str, Any]:
        """The job's overrides that can change its results (not ``progress``/``jobs``)."""
        return {key: value for key, value in parse_overrides(self.overrides).items()
                if key not in DISPLAY_ONLY_KEYS}


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["block_size=16", "+x=a"]`` -> ``{"block_size": 16, "x": "a"}`` (YAML-typed values)."""
    params = {}
    for item in overrides:
        if "=" not in item:
            continue
        key, value = item.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("hydra."):
            continue
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = value
        if isinstance(parsed, (list, dict)) or parsed is None:
            parsed = value
        params[key] = parsed
    return params


def expected_jobs(sweep_dir: Path) -> list[list[str]] | None:
    """The override lists the sweep meant to run, from ``multirun.yaml``; None if unknown."""
    path = sweep_dir / "multirun.yaml"
    if not path.exists():
        return None
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        return None
    return planned_jobs(cfg.get("hydra") or {}) if isinstance(cfg, dict) else None


def planned_jobs(hydra_cfg: Any) -> list[list[str]] | None:
    """The override lists of a sweep's jobs, from its ``hydra`` node (a mapping: the
    sweeper's params and the task overrides); None for a sweeper other than Hydra's basic
    one, which chooses its jobs as it goes, or a sweep that cannot be parsed."""
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        sweeper = hydra_cfg.get("sweeper") or {}
        if "basic_sweeper" not in str(sweeper.get("_target_", "basic_sweeper")).lower():
            return None
        arguments = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
        arguments += list((hydra_cfg.get("overrides") or {}).get("task") or [])
        parsed = OverridesParser.create().parse_overrides(arguments)
        batches = BasicSweeper.split_arguments(parsed, None)
        return [list(job) for batch in batches for job in batch]
    except Exception:  # noqa: BLE001 - an unusual sweep still gets a report of what exists
        return None


def set_aside_earlier_jobs(sweep_dir: Path, planned: list[list[str]]) -> tuple[Path | None, int]:
    """Move the job directories of an earlier sweep into ``sweep_dir`` whose overrides are
    none of the ``planned`` jobs' into ``sweep_dir/previous/<n>/`` (the first free n), with
    that sweep's ``multirun.yaml``, report and table, so that this sweep's report counts
    only its own jobs and nothing is lost. A directory of a planned job stays: its job
    skips a complete run of the same config, or sets that run's outputs aside itself.
    Returns (where they went, how many job directories), or (None, 0)."""
    wanted = {tuple(sorted(job)) for job in planned}
    stale = [path for path in _job_dirs(sweep_dir)
             if tuple(sorted(_overrides(path))) not in wanted]
    if not stale:
        return None, 0
    dest = next_previous_dir(sweep_dir)
    sweep_files = [sweep_dir / name for name in ("multirun.yaml", REPORT_NAME, TABLE_NAME)]
    for path in stale + [path for path in sweep_files if path.is_file()]:
        target = dest / path.relative_to(sweep_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        path.rename(target)
    return dest, len(stale)


def _overrides(job_dir: Path) -> list[str]:
    """A job directory's overrides (``.hydra/overrides.yaml``; [] without one); an
    ``InputError`` naming the file when it is not a YAML list."""
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return []
    try:
        overrides = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"not a readable YAML list of overrides ({reason})",
                         path=str(path)) from None
    if not isinstance(overrides, list):
        raise InputError(f"must be a list of overrides, got {type(overrides).__name__}",
                         path=str(path))
    return [str(o) for o in overrides]


def _job_dirs(sweep_dir: Path, depth: int = 3) -> list[Path]:
    found = []

    def walk(path: Path, level: int) -> None:
        for child in sorted(path.iterdir(), key=lambda p: (len(p.name), p.name)):
            if not child.is_dir() or child.is_symlink() or child.name in _SKIP_DIRS:
                continue  # (a link may lead out of the sweep: its job is not this sweep's)
            if (child / ".hydra" / "overrides.yaml").exists() or (child / "results.json").exists() \
                    or (child / "kernel_results.json").exists():
                found.append(child)
            elif level < depth:
                walk(child, level + 1)

    walk(sweep_dir, 1)
    return found


def failure_reason(job_dir: Path) -> str | None:
    """The last line of a failed job's ``job_failed.txt`` (its error), or None without one."""
    marker = job_dir / FAILED_MARKER
    if not marker.exists():
        return None
    return (marker.read_text(encoding="utf-8").strip().splitlines() or ["failed"])[-1]


def collect_jobs(sweep_dir: Path) -> list[Job]:
    """Every job directory of the sweep, plus expected jobs that never got one."""
    jobs = []
    for path in _job_dirs(sweep_dir):
        job = Job(str(path.relative_to(sweep_dir)), _overrides(path), FAILED)
        if (path / "kernel_results.json").exists():
            try:
                import json

                job.kernel_results = json.loads((path / "kernel_results.json").read_text("utf-8"))
            except ValueError as exc:
                job.reason = f"kernel_results.json unreadable: {exc}"
        if (path / "results.json").exists():
            try:
                job.results = read_results(path / "results.json")
            except InputError as exc:
                job.status, job.reason = FAILED, f"unreadable results: {exc}"
            else:
                complete = job.results.get("complete", True)
                job.status = FINISHED if complete else INCOMPLETE
                if not complete:
                    job.reason = str(job.results.get("stop_reason", "stopped early"))
        elif job.kernel_results is not None and not job.reason:
            job.status = FINISHED
        if job.status == FAILED and not job.reason:
            job.reason = failure_reason(path) or "no results.json (the job failed, or is still running)"
        jobs.append(job)
    expected = expected_jobs(sweep_dir)
    if expected is not None:
        seen = [sorted(job.overrides) for job in jobs]
        for overrides in expected:
            if sorted(overrides) in seen:
                seen.remove(sorted(overrides))
            else:
                jobs.append(Job("-", overrides, MISSING, "no job directory (never started)"))
    return jobs


# Leaves of the kernel benchmark's per-head ``summary`` worth a line in a sweep.
_KERNEL_LEAVES = ("paged_over_contiguous.median", "indirection_share.max", "paged_frac_copy_bw_max")


def _kernel_scalars(kernel_results: dict | None) -> dict[str, float]:
    """Headline numbers of a kernel benchmark in a job dir: ``kernel.<head>.<metric>``."""
    if not kernel_results:
        return {}
    out = {}
    summary = kernel_results.get("summary") or {}
    for head, stats in summary.items() if isinstance(summary, dict) else ():
        if not isinstance(stats, dict):
            continue
        for leaf in _KERNEL_LEAVES:
            node: Any = stats
            for part in leaf.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, (int, float)) and not isinstance(node, bool) and math.isfinite(node):
                out[f"kernel.{head}.{leaf}"] = float(node)
    return out


def aggregate(jobs: list[Job]) -> tuple[pd.DataFrame, list[str]]:
    """One row per (job, system) with params and headline metrics; and the swept keys."""
    rows = []
    for job in jobs:
        if job.results is None and job.kernel_results is None:
            continue
        base = {"job": job.name, "status": job.status, **job.params,
                **_kernel_scalars(job.kernel_results)}
        systems = (job.results or {}).get("systems") or {}
        if not systems:
            rows.append({**base, "system": "kernels"})
        for name, summary in systems.items():
            rows.append({**base, "system": name, **headline_values(summary)})
    frame = pd.DataFrame(rows)
    all_params: dict[str, set] = {}
    for job in jobs:
        for key, value in job.params.items():
            all_params.setdefault(key, set()).add(repr(value))
    swept = [k for k, values in all_params.items() if len(values) > 1]
    return frame, swept


def _with_int_counts(frame: pd.DataFrame) -> pd.DataFrame:
    """Float columns whose values are all whole numbers (counts that became floats because
    some rows lack them) as nullable integers: ``9``, not ``9.0``."""
    out = frame.copy()
    for name in out.columns:
        column = out[name]
        if column.dtype.kind == "f" and column.notna().any():
            values = column.dropna()
            if (values == values.round()).all() and values.abs().max() < 2**53:
                out[name] = column.astype("Int64")
    return out


def _sort_key(values: list) -> list:
    """Numbers ascending; anything else in order of first appearance (the sweep's order)."""
    if _is_numeric(values):
        return sorted(values)
    return list(dict.fromkeys(values))


def _is_numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def sweep_figure(frame: pd.DataFrame, x_key: str, others: list[str], metrics: list[tuple[str, str]],
                 colors: dict[str, str]) -> plt.Figure:
    """A grid of panels, one per metric: metric vs ``x_key``, one line per system.

    With other swept parameters, each of their value combinations gets its own line
    style (same system colour).
    """
    n = len(metrics)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.1 * cols, 2.9 * rows + 0.5), squeeze=False,
                             layout="constrained")
    x_values = _sort_key([_plain(v) for v in frame[x_key].dropna().unique()])
    numeric = _is_numeric(x_values)
    positive = numeric and all(v > 0 for v in x_values)
    log_x = positive and len(x_values) > 2 and max(x_values) / min(x_values) >= 16
    pow2 = log_x and all(float(v).is_integer() and int(v) & (int(v) - 1) == 0 for v in x_values)
    combos = (frame[others].astype(str).agg(", ".join, axis=1) if others
              else pd.Series([""] * len(frame), index=frame.index))
    combo_values = list(dict.fromkeys(combos))
    handles: dict[str, Any] = {}
    for ax, (key, label) in zip(axes.flat, metrics):
        for system in dict.fromkeys(frame["system"]):
            for c_index, combo in enumerate(combo_values):
                sub = frame[(frame["system"] == system) & (combos == combo)]
                sub = sub[sub[key].notna()] if key in sub else sub.iloc[0:0]
                if sub.empty:
                    continue
                order = [x_values.index(_plain(v)) for v in sub[x_key]]
                sub = sub.assign(_o=order).sort_values("_o")
                xs = sub[x_key].to_numpy(float) if numeric else sub["_o"].to_numpy()
                name = system if not combo else f"{system} · {', '.join(f'{o}={v}' for o, v in zip(others, combo.split(', ')))}"
                ys = sub[key].to_numpy(float)
                (line,) = ax.plot(xs, ys, color=colors.get(system, "#555"),
                                  linestyle=F.LINESTYLES[c_index % len(F.LINESTYLES)],
                                  marker=F.MARKERS[c_index % len(F.MARKERS)], markersize=3.5,
                                  linewidth=1.3, label=name)
                handles.setdefault(name, line)
                stopped = (sub["status"] == INCOMPLETE).to_numpy() if "status" in sub else None
                if stopped is not None and stopped.any():  # its figures cover part of the run
                    handles.setdefault(STOPPED_LABEL, ax.scatter(
                        xs[stopped], ys[stopped], s=60, marker="o", facecolors="none",
                        edgecolors="#d62728", linewidths=1.4, zorder=3, label=STOPPED_LABEL))
        ax.set_ylabel(label, fontsize=8)
        ax.set_xlabel(x_key, fontsize=8)
        if numeric:  # ticks at the swept values themselves, on a linear or a log axis
            if log_x:
                ax.set_xscale("log", base=2 if pow2 else 10)
            ax.set_xticks([float(v) for v in x_values], [f"{v:g}" for v in x_values], fontsize=7,
                          rotation=0 if len(x_values) <= 8 else 45)
            ax.minorticks_off()
        else:
            ax.set_xticks(range(len(x_values)), [str(v) for v in x_values], fontsize=7,
                          rotation=20)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    # NOTE: no figure title (the section heading names the parameter): it would collide
    # with the legend row above the panels.
    fig.legend(list(handles.values()), list(handles), loc="outside upper center", fontsize=8,
               frameon=False, ncol=min(len(handles), 5))
    return fig


def _focus_metrics(sweep_dir: Path) -> list[str]:
    """``experiment.focus`` of the sweep's config: the metrics its experiment is about."""
    path = sweep_dir / "multirun.yaml"
    if not path.exists():
        return []
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        return []
    experiment = cfg.get("experiment")
    focus = experiment.get("focus") if isinstance(experiment, dict) else None
    return [str(m) for m in focus] if isinstance(focus, list) else []


def render_sweep_report(sweep_dir: Path | str) -> Path:
    """Write ``sweep_report.html`` (and ``sweep_results.csv``) at the top of ``sweep_dir``."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise InputError("not a directory; pass a Hydra multirun directory", path=str(sweep_dir))
    jobs = collect_jobs(sweep_dir)
    if not jobs:
        raise InputError("no job directories (with .hydra/overrides.yaml or results.json) here; "
                         "pass the top of a multirun directory", path=str(sweep_dir))
    frame, swept = aggregate(jobs)
    counts = {s: sum(j.status == s for j in jobs) for s in (FINISHED, INCOMPLETE, FAILED, MISSING)}
    title = f"pagebench sweep: {sweep_dir.name}"
    parts = [f"<h1>{esc(title)}</h1>",
             f"<p class='meta' id='sweep-meta'>{len(jobs)} jobs: " + " · ".join(
                 f"{esc(k)} <b>{v}</b>" for k, v in counts.items()) +
             f" · swept: <b>{esc(', '.join(swept) or 'nothing')}</b> · directory "
             f"<b>{esc(sweep_dir)}</b></p>"]
    first = next((j.results for j in jobs if j.results), None)
    if first:
        parts.append("<p class='meta'>" + " · ".join(
            f"{k} <b>{esc(v)}</b>" for k, v in (
                ("workload", first["workload"].get("name")), ("model", first["model"]["name"]),
                ("hardware", first["hardware"]["name"]), ("executor", first.get("executor")),
                ("seed", first.get("seed")), ("pagebench", first.get("pagebench_version")))
            if v is not None) + " (of the first finished job)</p>")
    not_done = [j for j in jobs if j.status != FINISHED]
    if not_done:
        parts.append("<h2 id='not-finished'>Jobs that did not finish</h2>")
        parts.append(table(["job", "overrides", "status", "reason"],
                           [[j.name, " ".join(j.overrides), j.status, j.reason] for j in not_done],
                           text_columns=(0, 1, 2, 3), css_id="unfinished-table"))
    if frame.empty:
        parts.append(absent("Results (no job finished)"))
    else:
        colors = F.system_colors(list(dict.fromkeys(frame["system"])))
        metric_cols = [(m.key, m.label) for m in HEADLINE_METRICS
                       if m.key in frame and frame[m.key].notna().any()]
        metric_cols += [(c, c.replace("kernel.", "kernel: ")) for c in frame.columns
                        if c.startswith("kernel.") and frame[c].notna().any()]
        focus = [m for m in _focus_metrics(sweep_dir) if m in dict(metric_cols)]
        metric_cols.sort(key=lambda kv: (kv[0] not in focus,
                                         focus.index(kv[0]) if kv[0] in focus else 0))
        if not swept:
            parts.append("<p class='note'>No parameter varied across the finished jobs: the "
                         "table lists them.</p>")
        for key in swept:
            if key not in frame or frame[key].isna().all():
                continue
            others = [o for o in swept if o != key and o in frame]
            parts.append(f"<h2 id='vs-{esc(key)}'>Metrics vs {esc(key)}</h2>")
            styles = (f"; line styles and markers tell the values of {', '.join(others)} apart"
                      if others else "")
            parts.append(PendingFigure(
                functools.partial(sweep_figure, frame, key, others, metric_cols, colors),
                f"headline metrics vs {key}",
                f"One panel per headline metric against {key}, one line per system{styles}. "
                "Points circled in red are jobs that stopped early: their figures cover only "
                "part of the run."))
        if "block_size" in swept:  # the memory and the time effect of the block size, apart
            from pagebench.reports.block_size_effects import sweep_effects

            parts.append(sweep_effects([j for j in jobs if j.status == FINISHED]))
        shown = ["job", "status", *swept, "system", *[k for k, _ in metric_cols]]
        labels = ["job", "status", *swept, "system", *[lab for _, lab in metric_cols]]
        sort_cols = [c for c in (*swept, "system") if c in frame]
        counted = _with_int_counts(frame)  # counts as whole numbers: 9, not 9.000
        ordered = (counted.sort_values(sort_cols, key=lambda s: s.map(_sortable)) if sort_cols
                   else counted)
        parts.append("<h2 id='table'>All results</h2>")
        parts.append(table(labels, [[_cell(row.get(c)) for c in shown]
                                    for row in ordered.to_dict("records")],
                           text_columns=tuple(range(len(swept) + 3)), digits=3,
                           css_id="sweep-table"))
        atomic_write_text(sweep_dir / TABLE_NAME, _with_int_counts(frame).to_csv(index=False))
    out = sweep_dir / REPORT_NAME
    atomic_write_text(out, page(title, resolve(parts)))
    return out


def _plain(value):
    """numpy scalars as Python ones (so 16 sorts as a number, not as "16")."""
    return value.item() if isinstance(value, np.generic) else value


def _sortable(value):
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def _cell(value):
    if value is pd.NA:
        return None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
