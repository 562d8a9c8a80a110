"""Hydra callback: sweep progress per job, and the sweep report when a multirun ends.

Configured in ``conf/config.yaml`` (``hydra.callbacks.sweep_report``); it works with
every launcher (basic, joblib, Ray, Submitit) because it only reads and writes
files under ``hydra.sweep.dir``, which all jobs share.

- ``on_multirun_start``: prints how many jobs the sweep will run and where.
- ``on_job_end`` (in the job's process): records a failed job's error in
  ``job_failed.txt``, prints ``sweep: k/N jobs done``; once any job has failed it
  also re-renders the sweep report, because Hydra skips ``on_multirun_end`` when a
  job raised.
- ``on_multirun_end``: renders ``sweep_report.html`` at the top of the sweep dir.
- A sweep that stops before its end (Ctrl-C, which skips ``on_multirun_end``; a job that
  raised) still gets the report of what finished, when the process exits.
"""

from __future__ import annotations

import atexit
import sys
import traceback
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

# NOTE: pagebench.reports.sweep (matplotlib, pandas) is imported when a sweep needs it: every run,
# a single one included, instantiates this callback, and a run with report=false (or one
# refused for a config error) never draws anything.


def _sweep_dir(config: DictConfig) -> Path | None:
    try:
        return Path(str(config.hydra.sweep.dir))
    except Exception:  # noqa: BLE001 - no hydra node: not a Hydra job
        return None


def _is_multirun(config: DictConfig) -> bool:
    try:
        return str(config.hydra.mode) in ("RunMode.MULTIRUN", "MULTIRUN")
    except Exception:  # noqa: BLE001
        return False


class SweepReportCallback(Callback):
    """Progress of a sweep, and its report at the end (``enabled: false`` turns it off)."""

    def __init__(self, enabled: bool = True, progress: bool = True) -> None:
        self.enabled = enabled
        self.progress = progress
        self._unreported = False  # a job ended in this process since the report was drawn

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = _sweep_dir(config)
        if sweep_dir is None:
            return
        from pagebench.reports.sweep import planned_jobs, set_aside_earlier_jobs

        # NOTE: multirun.yaml is written by the sweeper after this call: plan from the config
        planned = planned_jobs(config.hydra)
        if planned is not None and sweep_dir.is_dir():
            dest, moved = set_aside_earlier_jobs(sweep_dir, planned)
            if moved:
                print(f"sweep: {moved} job directories of an earlier sweep here, not in this one, "
                      f"moved to {dest}", file=sys.stderr, flush=True)
        if self.progress:
            print(f"sweep: {len(planned)} jobs -> {sweep_dir}" if planned is not None
                  else f"sweep -> {sweep_dir}", file=sys.stderr, flush=True)
        if self.enabled:
            self._unreported = True  # until on_multirun_end draws it
            atexit.register(self._report_at_exit, sweep_dir)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not _is_multirun(config):
            return
        self._unreported = True
        sweep_dir = _sweep_dir(config)
        if sweep_dir is None:
            return
        from pagebench.reports.sweep import FAILED_MARKER, collect_jobs, expected_jobs

        failed = job_return.status == JobStatus.FAILED
        if failed:
            error = job_return._return_value  # the exception (return_value would re-raise it)
            try:
                out_dir = Path(str(config.hydra.runtime.output_dir))
                if isinstance(error, CompactHydraException):  # a message for the user
                    text = summary = str(error)
                elif isinstance(error, BaseException):
                    text = "".join(traceback.format_exception(error))
                    summary = f"{type(error).__name__}: {error}"
                else:
                    text = summary = str(error)
                last = summary.splitlines()[0]  # the reason the sweep report shows
                (out_dir / FAILED_MARKER).write_text(
                    (text if text == last else text + "\n" + last) + "\n", encoding="utf-8")
            except Exception:  # noqa: BLE001 - never turn a report problem into a job failure
                pass
        try:
            jobs = collect_jobs(sweep_dir)
        except Exception:  # noqa: BLE001
            return
        if self.progress:
            expected = expected_jobs(sweep_dir)
            total = len(expected) if expected is not None else len(jobs)
            done = sum(j.status == "finished" for j in jobs)
            bad = sum(j.status in ("failed", "incomplete") for j in jobs
                      if (sweep_dir / j.name / ".hydra").exists())
            num = config.hydra.job.get("num", "?")
            what = "failed" if failed else "done"
            print(f"sweep: job #{num} {what}; {done}/{total} jobs finished"
                  + (f", {bad} failed or running" if bad else ""), file=sys.stderr, flush=True)
        if self.enabled and (failed or any(j.status == "failed" and
                                           (sweep_dir / j.name / FAILED_MARKER).exists()
                                           for j in jobs)):
            self._render(sweep_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = _sweep_dir(config)
        if self.enabled and sweep_dir is not None:
            self._render(sweep_dir)
        if self.progress and sweep_dir is not None and sweep_dir.is_dir():
            from pagebench.reports.summary import print_sweep_summary
            from pagebench.reports.sweep import collect_jobs

            print_sweep_summary(sweep_dir, collect_jobs(sweep_dir))

    def _report_at_exit(self, sweep_dir: Path) -> None:
        """Draw the report of a sweep that stopped before ``on_multirun_end``, unless this
        process drew it after the last job it saw end."""
        if self._unreported:
            print("sweep stopped before its end: drawing the report of what finished",
                  file=sys.stderr, flush=True)
            self._render(sweep_dir)

    def _render(self, sweep_dir: Path) -> None:
        self._unreported = False
        try:
            from pagebench.reports.sweep import render_sweep_report

            out = render_sweep_report(sweep_dir)
        except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) while drawing: exit 130, no traceback
            print(f"interrupted: sweep report not written; draw it with: python -m "
                  f"pagebench.reports {sweep_dir}", file=sys.stderr, flush=True)
            raise SystemExit(130) from None
        except Exception as exc:  # noqa: BLE001 - the jobs' results are safe; say how to retry
            print(f"sweep report not written ({exc}); retry with: python -m pagebench.reports {sweep_dir}",
                  file=sys.stderr)
            return
        print(f"sweep report: {out}", file=sys.stderr, flush=True)
