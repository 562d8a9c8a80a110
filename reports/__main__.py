"""Re-render reports from existing results, without re-running anything.

    python -m pagebench.reports outputs/2026-11-30/12-00-00        # a run: report.html
    python -m pagebench.reports multirun/2026-11-30/12-00-00       # a sweep: sweep_report.html
                                                         # (and each job's report.html)
    python -m pagebench.reports outputs/.../vllm_fig2              # a paper study (study.json)
    python -m pagebench.reports multirun/capacity/...              # a capacity search:
                                                         # capacity_report.html (capacity.json)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import PagebenchError


def is_run_dir(path: Path) -> bool:
    return (path / "results.json").exists() or (path / "kernel_results.json").exists()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagebench.reports", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run or multirun directories")
    parser.add_argument("--no-jobs", action="store_true",
                        help="for a multirun directory, skip re-rendering each job's report.html")
    args = parser.parse_args(argv)
    from pagebench.reports.render import render_run_report
    from pagebench.reports.sweep import collect_jobs, failure_reason, render_sweep_report

    status = 0
    for path in args.dirs:
        if not path.is_dir():
            what = "not a directory" if path.exists() else "no such directory"
            print(f"error: {path}: {what}; pass a run, sweep or study directory", file=sys.stderr)
            status = 2
            continue
        try:
            if (path / "study.json").exists():
                from pagebench.reports.paper_section import render_study_report

                print(render_study_report(path))
                continue
            if is_run_dir(path):
                print(render_run_report(path))
                continue
            if (path / "capacity.json").exists():
                from harness.fileio import read_json
                from pagebench.reports.capacity_section import render_capacity_report

                print(render_capacity_report(path, read_json(path / "capacity.json")))
                continue
            if (path / ".hydra" / "overrides.yaml").exists():  # a run that wrote no results
                reason = failure_reason(path) or "it failed, or is still running"
                print(f"error: {path}: a run directory without results ({reason})", file=sys.stderr)
                status = 2
                continue
            if not args.no_jobs:
                for job in collect_jobs(path):
                    job_dir = path / job.name
                    if job.name != "-" and is_run_dir(job_dir):
                        try:
                            render_run_report(job_dir)
                        except PagebenchError as exc:
                            print(f"warning: {job_dir}: {exc}", file=sys.stderr)
            print(render_sweep_report(path))
        except PagebenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
