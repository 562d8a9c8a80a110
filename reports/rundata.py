"""Everything a run directory holds, loaded once for the report and the claims table.

Only ``results.json`` is required; the step and request tables, ``run_info.json``,
``kernel_results.json`` and NVML samples are used when present.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.errors import InputError
from harness.fileio import read_json
from harness.results_format import read_results

KERNEL_RESULTS = "kernel_results.json"
# Where harness/engine/nvml.py may leave its samples (the first that exists wins).
NVML_FILES = ("nvml_samples.csv", "nvml.csv", "nvml_samples.parquet", "nvml_samples.jsonl",
              "nvml_samples.json")


@dataclass
class RunData:
    run_dir: Path
    results: dict | None  # None for a kernels-only run
    run_info: dict = field(default_factory=dict)
    steps: dict[str, pd.DataFrame] = field(default_factory=dict)
    requests: dict[str, pd.DataFrame] = field(default_factory=dict)
    kernel_results: dict | None = None
    nvml: pd.DataFrame | None = None
    nvml_path: Path | None = None

    @property
    def systems(self) -> dict[str, dict]:
        return (self.results or {}).get("systems", {})


def _read_json(path: Path) -> dict:
    data = read_json(path)
    if not isinstance(data, dict):
        raise InputError("expected a JSON object", path=str(path))
    return data


def _read_table(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".jsonl":
        return pd.read_json(path, lines=True)
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            data = data.get("samples", [])
        return pd.DataFrame(data)
    return pd.read_csv(path)


def load_run(run_dir: Path | str) -> RunData:
    """Load a run directory. Raises ``InputError`` naming the file at fault."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError("not a directory; pass a run directory (it holds results.json)",
                         path=str(run_dir))
    has_results = (run_dir / "results.json").exists()
    kernel_path = run_dir / KERNEL_RESULTS
    if not has_results and not kernel_path.exists():
        raise InputError("no results.json (nor kernel_results.json) here; pass a run directory "
                         "written by `python -m harness`", path=str(run_dir))
    results = read_results(run_dir / "results.json") if has_results else None
    data = RunData(run_dir=run_dir, results=results)
    if (run_dir / "run_info.json").exists():
        data.run_info = _read_json(run_dir / "run_info.json")
    if kernel_path.exists():
        data.kernel_results = _read_json(kernel_path)
    for name in data.systems:
        for kind, store in (("steps", data.steps), ("requests", data.requests)):
            for suffix in (".csv", ".parquet"):
                path = run_dir / f"{kind}_{name}{suffix}"
                if path.exists():
                    try:
                        table = _read_table(path)
                    except Exception as exc:  # a broken table should not lose the report
                        raise InputError(f"cannot read table: {exc}", path=str(path)) from None
                    if len(table) or kind == "requests":  # no steps (all rejected): no timeline
                        store[name] = table
                    break
    for filename in NVML_FILES:
        path = run_dir / filename
        if path.exists():
            try:
                frame = _read_table(path)
            except Exception as exc:
                raise InputError(f"cannot read NVML samples: {exc}", path=str(path)) from None
            if len(frame):
                data.nvml, data.nvml_path = frame, path
            break
    return data
