"""Read a workload preset from ``conf/workload/`` outside Hydra (tests, scripts).

Most presets are plain ``workload`` nodes; a preset that also selects a model,
hardware or engine (``mooncake``) is ``# @package _global_`` with its workload
under a ``workload:`` key. ``load_preset`` returns the workload node either way.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

import harness

PRESET_DIR = harness.CONF_DIR / "workload"


def load_preset(name_or_path: str | Path) -> dict:
    """The workload node of preset ``name`` (or of a YAML file path) as a plain dict."""
    path = Path(name_or_path)
    if path.suffix != ".yaml":
        path = PRESET_DIR / f"{name_or_path}.yaml"
    node = OmegaConf.to_container(OmegaConf.load(path))
    if "workload" in node and "kind" not in node:
        node = node["workload"]
    return node
