"""Reuse a system's results from another job of the same sweep when its inputs are the same.

A sweep over ``block_size`` re-simulates every contiguous system once per block size,
although a contiguous system never reads the block size: its results are the same each
time. Each system of a sim run gets an input key (``system_input_key``): the sha256 of the
resolved config without the keys that only choose or describe systems (``block_size``,
``systems``, the ``allocator`` catalog, display-only keys), plus the system's own resolved
spec (a paged system's spec holds its block size, a contiguous one's none), the pool's
capacity and the content of the files the config reads. ``results.json`` records the keys
(``system_inputs``). Before a job of a sweep simulates a system, ``find_reusable`` looks for
a complete run in a sibling directory (the sweep's other jobs) whose same-named system has
the same key, and ``copy_tables`` takes its step and request tables: the sim executor is
deterministic for a seed, so they are what the simulation would write, byte for byte.
``PAGEBENCH_RERUN=1`` simulates every system again.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.fileio import read_json
from harness.run.job_identity import config_hash

# Keys that choose or describe the systems, not what one system simulates.
_SYSTEM_CHOICE_KEYS = ("block_size", "systems", "allocator")


def system_input_key(cfg: Any, system: Any, capacity: int) -> str:
    """The identity of what ``system`` simulates in the run of ``cfg`` (a resolved config)."""
    from omegaconf import DictConfig, OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    plain = {k: v for k, v in plain.items() if k not in _SYSTEM_CHOICE_KEYS}
    plain["__system__"] = asdict(system)
    plain["__capacity_slots__"] = capacity
    return config_hash(plain)


def find_reusable(out_dir: Path, name: str, key: str) -> tuple[Path, dict] | None:
    """(the run directory, its results.json summary of ``name``) of a complete sibling run
    whose system ``name`` has input key ``key``; None when there is none (or reuse is off)."""
    if os.environ.get("PAGEBENCH_RERUN"):
        return None
    out_dir = Path(out_dir).resolve()
    for sibling in sorted(out_dir.parent.iterdir()) if out_dir.parent.is_dir() else ():
        results_path = sibling / "results.json"
        if sibling == out_dir or not results_path.is_file():
            continue
        try:
            results = read_json(results_path)
        except Exception:  # noqa: BLE001 - an unreadable sibling is simply not reused
            continue
        if not isinstance(results, dict) or not results.get("complete"):
            continue
        summary = (results.get("systems") or {}).get(name)
        if ((results.get("system_inputs") or {}).get(name) == key and isinstance(summary, dict)
                and all((sibling / f"{kind}_{name}.csv").is_file()
                        for kind in ("steps", "requests"))):
            return sibling, summary
    return None


def copy_tables(source: Path, out_dir: Path, name: str) -> None:
    """Copy system ``name``'s step and request tables from ``source`` into ``out_dir``
    (each written under a temporary name, then renamed: never half a table)."""
    for kind in ("steps", "requests"):
        target = Path(out_dir) / f"{kind}_{name}.csv"
        partial = target.with_name(f".{target.name}.partial")
        shutil.copyfile(Path(source) / target.name, partial)
        os.replace(partial, target)


def reuse_earlier(cfg: Any, systems: list, capacity: int, out_dir: Path,
                  keys: dict[str, str]) -> list[tuple[Any, dict]]:
    """Fill ``keys`` with every system's input key; take the tables of each system that a
    sibling run already simulated with the same inputs, saying so on the console. Returns
    the (system, results.json summary) pairs taken."""
    import sys

    taken = []
    sweep = in_sweep()
    for system in systems:
        keys[system.name] = system_input_key(cfg, system, capacity)
        found = find_reusable(out_dir, system.name, keys[system.name]) if sweep else None
        if found is None:
            continue
        source, summary = found
        copy_tables(source, out_dir, system.name)
        print(f"  {system.name}: reused from {source} (the same inputs: workload, model, hardware,"
              f" engine, system spec, seed; PAGEBENCH_RERUN=1 simulates it again)",
              file=sys.stderr)
        taken.append((system, summary))
    return taken


def in_sweep() -> bool:
    """Whether this run is a job of a Hydra sweep (``-m``): only a sweep's own jobs are
    reused, never another run that happens to sit in the same parent directory."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:  # noqa: BLE001 - no Hydra: not a sweep
        return False
