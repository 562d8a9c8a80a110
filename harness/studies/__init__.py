"""Studies: one command that runs many sub-runs in-process and writes one report.

``python -m harness experiment=vllm_fig12`` composes a config with ``run: study``
and a ``study`` node; ``run_study`` looks the study up by ``study.name``, runs its
jobs (one per core, see ``harness.studies.runner``), and writes into the Hydra run
directory:

- ``study.json``: the setup, every job's summary (the ``results.json`` system schema
  plus ``study`` extras), the derived measured values, and timing;
- ``report.html``: the study's section (``pagebench.reports.paper_section``): the figure drawn
  like the paper's, measured vs published values, and the causes of differences.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import __version__
from harness.config.cli_args import check_seed
from harness.errors import ConfigError
from harness.fileio import write_json
from harness.results_format import STUDY_SCHEMA_VERSION
from harness.config.specs import REQUIRED_KEYS
from harness.run.run_setup import run_setup

_SUMMARY_KEYS = ("label", "allocator", "memory", "requests", "throughput", "latency", "batch",
                 "preemptions", "swaps", "prefix_cache", "sharing_savings_pct", "complete",
                 "stop_reason", "study", "time_by_phase_s", "cost_model")


def _plain(cfg: Any) -> dict:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg)


@dataclass
class PreparedStudy:
    """A study whose config is checked and whose jobs are planned; nothing has run."""

    name: str
    study: dict
    plain: dict
    workers: int
    plan: Any


def prepare_study(cfg: Any) -> PreparedStudy:
    """Check the study's config (its ``study`` node, ``seed``, ``study.workers``, every
    job's specs and system) and plan its jobs, without running any: ``python -m harness``
    calls it before it sets an earlier run's outputs aside, so a config error leaves them
    where they were. Raises ``ConfigError``."""
    from harness.run.serve import TOP_LEVEL_KEYS
    from harness.studies.paper import STUDIES, check_study_keys
    from harness.processes import usable_cpus

    plain = _plain(cfg)
    study = plain.pop("study", None)
    if not isinstance(study, dict) or "name" not in study:
        raise ConfigError("study: run=study needs a study node with a name; use an experiment, "
                          f"e.g. experiment=vllm_fig2 (known: {', '.join(sorted(STUDIES))})")
    unknown = sorted(set(plain) - TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown top-level key")
    # every run's keys but those the study sets per job
    missing = [key for key in REQUIRED_KEYS if key not in plain and key not in ("systems", "workload")]
    if missing:
        raise ConfigError(f"{missing[0]}: missing; a study needs it (set {missing[0]}=...)")
    name = study["name"]
    if name not in STUDIES:
        raise ConfigError(f"study.name: unknown study {name!r}; known: {', '.join(sorted(STUDIES))}")
    check_study_keys(study)
    check_seed(plain["seed"])
    plain["run"] = "serve"
    plain["progress"] = False
    workers = study.get("workers")
    if workers is None:
        workers = usable_cpus()
    elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"study.workers: must be a positive integer or null (one worker per "
                          f"core), got {workers!r}")

    plan = STUDIES[name](plain, study)
    for job in (job for chain in plan.chains for job in chain.jobs):
        run_setup(job.cfg, [job.system])  # its specs checked now, not when its turn comes
    return PreparedStudy(name, study, plain, workers, plan)


def run_study(cfg: Any, out_dir: Path, prepared: PreparedStudy | None = None) -> dict:
    """Run the study named by ``cfg.study.name`` (``prepared``: what ``prepare_study``
    made of ``cfg``, when the caller checked it already); write study.json and
    report.html into ``out_dir``."""
    from harness.studies.runner import run_chains

    out_dir = Path(out_dir)
    if prepared is None:
        prepared = prepare_study(cfg)
    name, study, plain, workers, plan = (prepared.name, prepared.study, prepared.plain,
                                         prepared.workers, prepared.plan)
    num_jobs = sum(len(c.jobs) for c in plan.chains)
    print(f"pagebench {__version__}: study {name} ({study.get('figure', '')}): up to {num_jobs} "
          f"jobs on {workers} worker(s)", file=sys.stderr)
    started, cpu_started = time.perf_counter(), time.process_time()
    pairs = run_chains(plan.chains, workers, plan.describe)
    wall = time.perf_counter() - started
    derived = plan.derive(pairs)
    job_cpu = sum(s["study"]["cpu_time_s"] for _, s in pairs)
    result = {
        "schema_version": STUDY_SCHEMA_VERSION,
        "pagebench_version": __version__,
        "kind": "study",
        "study": name,
        "figure": study.get("figure"),
        "params": {k: v for k, v in study.items() if k != "workloads"},
        "workloads": study.get("workloads", {}),  # as composed: jobs[].overrides change them
        "setup": {"model": plain["model"], "hardware": plain["hardware"], "engine": plain["engine"],
                  "block_size": plain["block_size"], "seed": plain["seed"],
                  "allocator": plain["allocator"]},
        "complete": all(s.get("complete", True) for _, s in pairs),
        "jobs": [{"key": j.key, "system": j.system, "params": j.params, "overrides": j.overrides,
                  "summary": {k: s[k] for k in _SUMMARY_KEYS if k in s}} for j, s in pairs],
        **derived,
        "timing": {
            "wall_time_s": round(wall, 2),
            "jobs_cpu_time_s": round(job_cpu, 2),
            "workers": workers,
            "cpus": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "main_cpu_time_s": round(time.process_time() - cpu_started, 2),
        },
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"node": platform.node(), "python": platform.python_version(),
                 "platform": platform.platform(), "processor": platform.processor() or None},
    }
    write_json(out_dir / "study.json", result)
    from pagebench.reports.paper_section import render_study_report

    render_study_report(out_dir)
    print(f"study {name}: {len(pairs)} jobs, wall {wall:.1f} s (jobs' CPU {job_cpu:.1f} s on "
          f"{workers} worker(s)); report in {out_dir / 'report.html'}", file=sys.stderr)
    return result
