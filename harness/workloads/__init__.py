"""Workloads: synthetic generators, trace loaders and arrival processes.

The engine calls ``build_workload(cfg, seed=..., max_model_len=...)`` with the
``workload`` config node; ``cfg.kind`` picks the builder from ``KINDS``. See
``conf/workload/*.yaml`` for the presets and README for the list.
"""

from harness.workloads.request import Request
from harness.workloads.build import Workload, build_workload
from harness.workloads.registry import KINDS, register
# Importing the modules registers their kinds.
from harness.workloads import chat, loaders, mixture, sharegpt, synthetic  # noqa: F401,E402

__all__ = ["KINDS", "Request", "Workload", "build_workload", "register"]
