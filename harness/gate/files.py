"""The gate's input files: result files, baselines and rules files, each checked, with
an InputError naming the file and field when one is bad."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable

from harness.errors import InputError
from harness.gate.compare import BASELINE_FORMAT
from harness.gate.metrics import KERNEL_SCHEMA, job_key
from harness.gate.rules import Rule
from harness.fileio import read_json
from harness.results_format import PREVIOUS_DIR, read_results

RESULT_FILES = ("results.json", "kernel_results.json")


def find_results(paths: Iterable[str]) -> list[Path]:
    """Result files from files, run directories or sweep directories."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            found.append(path)
            continue
        hits = sorted(p for name in RESULT_FILES for p in path.rglob(name)
                      if PREVIOUS_DIR not in p.relative_to(path).parts)  # earlier runs set aside
        if not hits:
            raise InputError("no results.json or kernel_results.json in this directory or below "
                             "it; pass a run directory or a results file", path=str(path))
        found.extend(hits)
    return found


def _finite(value: Any) -> bool:
    """A finite int or float (not a bool, not NaN or infinity)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def read_any_results(path: Path) -> dict:
    """A serving results.json (validated by ``read_results``) or a kernel_results.json."""
    if path.name != "kernel_results.json":
        return read_results(path)
    data = read_json(path, "results file not found")
    if not isinstance(data, dict) or data.get("schema") != KERNEL_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else None
        raise InputError(f"schema {found!r} is not supported (this pagebench reads "
                         f"{KERNEL_SCHEMA!r}); re-run the kernel benchmark", path=str(path))
    if not isinstance(data.get("rows"), list):
        raise InputError("missing 'rows' list", path=str(path), field="rows")
    return data


def load_current(paths: Iterable[str]) -> dict[str, dict]:
    current: dict[str, dict] = {}
    origin: dict[str, Path] = {}
    for path in find_results(paths):
        results = read_any_results(path)
        key = job_key(results)
        if key in current:
            raise InputError(f"two results files are the same job {key!r} (the other: "
                             f"{origin[key]}); gate them against separate baselines",
                             path=str(path))
        current[key], origin[key] = results, path
    return current


def load_baseline(path: Path) -> dict:
    """A baseline file, checked to hold only what ``make_baseline`` writes: per job a
    ``metrics`` mapping of finite numbers or null (no data)."""
    data = read_json(path, "baseline not found; create it with --update (then review and "
                            "commit it)")
    if not isinstance(data, dict) or data.get("pagebench_baseline") != BASELINE_FORMAT:
        raise InputError(f"not a pagebench baseline (format {BASELINE_FORMAT}); check the path "
                         "(--update writes a new one where no file exists)", path=str(path))
    if not isinstance(data.get("jobs"), dict):
        raise InputError("missing 'jobs' mapping", path=str(path), field="jobs")
    for key, job in data["jobs"].items():
        if not isinstance(job, dict):
            raise InputError(f"must be a mapping with 'metrics', got {job!r:.40}",
                             path=str(path), field=f"jobs.{key}")
        if not isinstance(job.get("metrics"), dict):
            got = f"got {job['metrics']!r:.40}" if "metrics" in job else "missing"
            raise InputError(f"must be a mapping of metric values ({got})", path=str(path),
                             field=f"jobs.{key}.metrics")
        for metric, value in job["metrics"].items():
            if value is not None and not _finite(value):
                raise InputError(f"must be a finite number or null, got {value!r:.40}",
                                 path=str(path), field=f"jobs.{key}.metrics.{metric}")
    return data


def load_rules(path: Path) -> tuple[Rule, ...]:
    """Rules from a JSON file in the ``--show-rules`` format, each field's type checked."""
    data = read_json(path, "rules file not found")
    names = {f.name for f in fields(Rule)}
    if not isinstance(data, list) or not data:
        raise InputError("expected a non-empty JSON list of rules (see --show-rules)",
                         path=str(path))
    rules = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not {"metric", "better"} <= set(item):
            raise InputError("each rule needs 'metric' and 'better'", path=str(path),
                             field=f"[{i}]")
        unknown = sorted(set(item) - names)
        if unknown:
            raise InputError(f"unknown key; rule keys are {', '.join(sorted(names))}",
                             path=str(path), field=f"[{i}].{unknown[0]}")
        if item["better"] not in ("higher", "lower", "equal", "info"):
            raise InputError("must be higher, lower, equal or info", path=str(path),
                             field=f"[{i}].better")
        for key in ("metric", "why"):
            if not isinstance(item.get(key, ""), str):
                raise InputError(f"must be a string, got {item[key]!r:.40}", path=str(path),
                                 field=f"[{i}].{key}")
        for key in ("abs_tol", "rel_tol", "noise_band"):
            value = item.get(key, 0)
            if not (key == "noise_band" and value is None) and not (_finite(value) and value >= 0):
                allowed = " or null" if key == "noise_band" else ""
                raise InputError(f"must be a finite non-negative number{allowed}, got "
                                 f"{value!r:.40}", path=str(path), field=f"[{i}].{key}")
        rules.append(Rule(**item))
    return tuple(rules)
