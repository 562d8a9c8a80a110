"""The Hydra app: ``python -m harness workload=docqa block_size=16`` (sweeps with ``-m``)."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from harness.errors import PagebenchError
from harness.results import atomic_write_text

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        atomic_write_text(out_dir / "config_resolved.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        if cfg.get("run", "serve") == "kernels":
            from kernels.benchmark import run_kernel_benchmark

            run_kernel_benchmark(cfg.kernel_bench, out_dir)
        else:
            from harness.run import run_serving

            run_serving(cfg, out_dir)
    except PagebenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
