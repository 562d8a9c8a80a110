"""The Hydra app: ``python -m harness workload=docqa block_size=16`` (sweeps with ``-m``).

Exit status: 0 done (or skipped: complete results for the same resolved config are
already in the run directory; set PAGEBENCH_RERUN=1 to run anyway), 2 a config or
input error (the message says what to fix), 130 interrupted (what had run is
written, marked incomplete).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.errors import PagebenchError
from harness.results import atomic_write_text, config_hash, existing_complete_results

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        try:
            resolved_yaml = OmegaConf.to_yaml(cfg, resolve=True)
            cfg_hash = config_hash(cfg)
        except OmegaConfBaseException as exc:  # a missing '???' value, a broken ${...}
            raise PagebenchError(f"config: {exc}".splitlines()[0]) from None
        mode = cfg.get("run", "serve")
        if mode != "kernels" and not os.environ.get("PAGEBENCH_RERUN"):
            done = existing_complete_results(out_dir, cfg_hash)
            if done is not None:
                print(f"skipped: {done} already holds complete results for this resolved config "
                      "(set PAGEBENCH_RERUN=1 to run again)", file=sys.stderr)
                return
        atomic_write_text(out_dir / "config_resolved.yaml", resolved_yaml)
        if mode == "study":  # an experiment that runs many sub-runs (conf/experiment/vllm_*.yaml)
            from harness.studies import run_study

            run_study(cfg, out_dir)
            return
        if mode == "kernels":
            from kernels.benchmark import run_kernel_benchmark

            run_kernel_benchmark(cfg.kernel_bench, out_dir)
            from reports.render import render_run_report

            render_run_report(out_dir)  # report.html with the kernels section
            return
        from harness.run import run_serving

        results = run_serving(cfg, out_dir)
    except PagebenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # a sweep records this job as failed (job_failed.txt) and runs the others
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    if results.get("stop_reason") == "interrupted":
        sys.exit(130)
    if not results.get("complete", True):
        reasons = sorted({s.get("stop_reason", "") for s in results["systems"].values()} - {""})
        print(f"warning: results are incomplete ({'; '.join(reasons) or 'see results.json'})",
              file=sys.stderr)


if __name__ == "__main__":
    main()
