"""The Hydra app: ``python -m harness workload=docqa block_size=16`` (sweeps with ``-m``).

Exit status: 0 done (or skipped: complete results for the same resolved config are
already in the run directory; set PAGEBENCH_RERUN=1 to run anyway; any other earlier
outputs there are moved to ``previous/<n>/`` first, never overwritten), 1 Hydra refused
the command line (e.g. an override's syntax; a sweep with a failed job), 2 a config or
input error (the message says what to fix; a key the config does not have is named with
the closest valid one, by ``harness.config.override_check``, before Hydra composes anything),
130 interrupted by Ctrl-C or SIGTERM (what had run is written, marked incomplete). The config is checked
(``check_config``: the specs the run builds) before an earlier run's outputs are moved
aside, so a config error leaves the run directory as it was.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import harness
from harness.config.specs import run_options
from harness.errors import ConfigError, PagebenchError
from harness.run.interrupts import terminate_as_interrupt
from harness.run.rejections import SERVED_NOTHING
from harness.fileio import atomic_write_bytes, atomic_write_text
from harness.run.job_identity import config_hash
from harness.run.results import existing_complete_results, set_aside_previous_run
from harness.run.run_lock import claim_run_dir
from pagebench.reports.summary import print_run_summary

CONF_DIR = str(harness.CONF_DIR)


class SweepJobError(CompactHydraException):
    """A sweep job's config or input error. Hydra prints the message of this kind of
    exception without a traceback when the sweep ends (exit status 1)."""


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    previous = None
    run_lock = contextlib.ExitStack()
    try:
        try:
            resolved_yaml = OmegaConf.to_yaml(cfg, resolve=True)
            cfg_hash = config_hash(cfg)
        except OmegaConfBaseException as exc:  # a missing '???' value, a broken ${...}
            raise PagebenchError(f"config: {exc}".splitlines()[0]) from None
        options = run_options(cfg)  # run, progress, report
        mode, report = options.run, options.report
        # every check of the config before the directory changes: a config error leaves an
        # earlier run's outputs where they are
        prepared = check_config(cfg)
        run_lock.enter_context(claim_run_dir(out_dir))  # one run at a time in out_dir
        if mode != "kernels" and not os.environ.get("PAGEBENCH_RERUN"):
            done = existing_complete_results(out_dir, cfg_hash)
            if done is not None:
                print(f"skipped: {done} already holds complete results for this resolved config "
                      "(set PAGEBENCH_RERUN=1 to run again)", file=sys.stderr)
                if report and mode == "serve" and not (out_dir / "report.html").exists():
                    from pagebench.reports.render import render_run_report

                    print(f"report: {render_run_report(out_dir)}", file=sys.stderr)
                return
        previous = set_aside_previous_run(out_dir)
        if previous is not None:
            print(f"note: {out_dir} held an earlier run's outputs; moved them to {previous}",
                  file=sys.stderr)
        atomic_write_text(out_dir / "config_resolved.yaml", resolved_yaml)
        if mode == "study":  # an experiment that runs many sub-runs (conf/experiment/vllm_*.yaml)
            from harness.studies import run_study

            run_study(cfg, out_dir, prepared)
            print_run_summary(out_dir)
            return
        if mode == "kernels":
            from pagebench.kernels.benchmark import prefer_explicit, run_kernel_benchmark

            spec = OmegaConf.to_container(cfg.kernel_bench, resolve=True)
            run_kernel_benchmark(prefer_explicit(spec, _overridden_keys("kernel_bench")), out_dir)
            if report:
                from pagebench.reports.render import render_run_report

                render_run_report(out_dir)  # report.html with the kernels section
            print_run_summary(out_dir)
            return
        from harness.run.serve import run_serving

        results = run_serving(cfg, out_dir, prepared)
        print_run_summary(out_dir)
        if str(results.get("stop_reason", "")).startswith(SERVED_NOTHING):
            raise ConfigError(f"{results['stop_reason']}: it rejected every request (see the "
                              f"warning above; the results are written to {out_dir})")
    except (PagebenchError, OmegaConfBaseException) as exc:
        if isinstance(exc, OmegaConfBaseException):  # a key the config lacks, read while running
            exc = PagebenchError(f"config: {exc}".splitlines()[0])
        if previous is not None:
            _put_back(previous, out_dir)
        _restore_earlier_hydra(out_dir)
        print(f"error: {exc}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            # a sweep records this job as failed (job_failed.txt) and runs the others
            raise SweepJobError(f"{type(exc).__name__}: {exc}") from None
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        run_lock.close()
    if results.get("stop_reason") == "interrupted":
        sys.exit(130)
    if not results.get("complete", True):
        reasons = sorted({s.get("stop_reason", "") for s in results["systems"].values()} - {""})
        print(f"warning: results are incomplete ({'; '.join(reasons) or 'see results.json'})",
              file=sys.stderr)
    return results  # a sweep's job returns them (the capacity search reads them)


def check_config(cfg: DictConfig) -> Any:
    """Every check of the composed config that does no work, for the run's mode (a serving
    run: ``harness.run.serve.prepare_serving``; a study: ``prepare_study``, its jobs' specs
    included). ``main`` calls it before it sets an earlier run's outputs aside. Returns what
    the mode prepared (the serving run's specs and jobs, or the study; None for kernels),
    which the run then uses; raises ``PagebenchError``."""
    try:
        mode = run_options(cfg).run  # run, progress, report
        if mode == "study":
            from harness.studies import prepare_study

            return prepare_study(cfg)
        if mode == "serve":
            from harness.run.serve import prepare_serving

            return prepare_serving(cfg)
        return None  # kernels: pagebench.kernels.benchmark checks kernel_bench before it measures
    except OmegaConfBaseException as exc:
        raise PagebenchError(f"config: {exc}".splitlines()[0]) from None


def _put_back(previous: Path, out_dir: Path) -> None:
    """After a run stopped on bad input before writing any output but its
    config_resolved.yaml (an error only building the workload finds, e.g. a trace's
    content): move the earlier run's outputs back from ``previous``, leaving the
    directory as it was."""
    from harness.run.results import RUN_OUTPUTS

    written = {path.name for pattern in RUN_OUTPUTS for path in out_dir.glob(pattern)
               if path.is_file()}
    if written - {"config_resolved.yaml"} or not previous.is_dir():
        return  # this run wrote results: they stay, the earlier ones stay in previous/
    try:
        if not (previous / "config_resolved.yaml").is_file():
            (out_dir / "config_resolved.yaml").unlink(missing_ok=True)
        for path in sorted(previous.iterdir()):
            os.replace(path, out_dir / path.name)
        previous.rmdir()
        if not any(previous.parent.iterdir()):
            previous.parent.rmdir()
    except OSError as err:
        print(f"note: the earlier run's outputs stay in {previous} ({err})", file=sys.stderr)
        return
    print(f"note: nothing was run: moved the earlier run's outputs back from {previous}",
          file=sys.stderr)


def _overridden_keys(node: str) -> list[str]:
    """The keys of ``node`` set on the command line (``node.key=...``, not deeper ones)."""
    keys = []
    for override in HydraConfig.get().overrides.task:
        path = override.split("=", 1)[0].lstrip("+~")
        if path.startswith(node + ".") and "." not in path[len(node) + 1:]:
            keys.append(path[len(node) + 1:])
    return keys


def _hydra_command_line():
    """Hydra's own parse of the command line: (its arguments, the rest), or None when it
    cannot parse it (Hydra then reports the bad command line itself)."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.exit_on_error = False
    try:
        return parser.parse_known_args()
    except (Exception, SystemExit):  # noqa: BLE001 - Hydra reports a bad command line itself
        return None


def _refuse_unusable_run_dir() -> None:
    """Exit 2 in one line, before Hydra creates anything, when the run directory
    (``hydra.run.dir``, a sweep's ``hydra.sweep.dir``, or the default under the current
    directory) cannot be used: ``harness.run.run_dir_check`` says why."""
    from harness.run.run_dir_check import run_dir_problem

    parsed = _hydra_command_line()
    if parsed is None:
        return
    args, extra = parsed
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion:
        return  # nothing is written
    key = "hydra.sweep.dir" if args.multirun else "hydra.run.dir"
    overrides = [*args.overrides, *(arg for arg in extra if not arg.startswith("-"))]
    given = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith(key + "=")]
    path = given[-1] if given else ("multirun" if args.multirun else "outputs")
    if "${" in path or "," in path:
        return  # Hydra resolves it
    problem = run_dir_problem(Path(path))
    if problem:
        print(f"error: {key}={path}: {problem}; choose another directory ({key}=DIR)",
              file=sys.stderr)
        sys.exit(2)
    if not args.multirun:
        _EARLIER_HYDRA.update(hydra_files_of_earlier_run(Path(path)))


# The earlier run's .hydra/ files (path -> bytes) and its results.json's (size, mtime), read
# before Hydra rewrites them: a run refused on its config puts them back (``main``).
_EARLIER_HYDRA: dict = {}


def hydra_files_of_earlier_run(run_dir: Path) -> dict:
    """``{"files": {path: bytes}, "results": (size, mtime_ns)}`` when ``run_dir`` holds an
    earlier run's results.json, else {}."""
    results = run_dir / "results.json"
    try:
        stat = results.stat()
        files = {p: p.read_bytes() for p in sorted((run_dir / ".hydra").glob("*.yaml"))}
    except OSError:
        return {}
    return {"files": files, "results": (stat.st_size, stat.st_mtime_ns)}


def _restore_earlier_hydra(out_dir: Path) -> None:
    """After a refused run: the earlier run's .hydra/ files again, if its results.json is
    still the one in ``out_dir`` (Hydra wrote this run's over them before any check ran)."""
    if not _EARLIER_HYDRA:
        return
    try:
        stat = (out_dir / "results.json").stat()
        if (stat.st_size, stat.st_mtime_ns) != _EARLIER_HYDRA["results"]:
            return
        for path, data in _EARLIER_HYDRA["files"].items():
            atomic_write_bytes(path, data)
    except OSError:
        return


def _refuse_unknown_overrides() -> None:
    """Exit 2 (a config error, as ``+key=value`` of an unknown key gets) with
    ``override_check``'s message when the command line overrides a key that the config
    cannot have, at any depth (Hydra's own message would suggest adding it with ``+``),
    or deletes one every run reads (``~seed``: the run would stop on it)."""
    from harness.config.override_check import check_overrides

    parsed = _hydra_command_line()
    if parsed is None:
        return
    args, extra = parsed
    overrides = [*args.overrides, *(arg for arg in extra if not arg.startswith("-"))]
    if args.config_dir or args.config_path or args.config_name or any(
            override.startswith("hydra.searchpath") for override in overrides):
        return  # other config files: only Hydra knows what they hold
    message = check_overrides(overrides)
    if message:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    if not args.multirun:
        from harness.config.override_check import sweep_without_multirun

        note = sweep_without_multirun(overrides)
        if note:
            print(f"note: {note}", file=sys.stderr)


if __name__ == "__main__":
    terminate_as_interrupt()  # SIGTERM (CI cancel, SLURM, timeout) is handled as Ctrl-C
    _refuse_unknown_overrides()
    _refuse_unusable_run_dir()
    main()
