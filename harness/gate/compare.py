"""Comparing results with a baseline, metric by metric, and writing a baseline."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from typing import Any, Iterable

from harness.gate.metrics import KERNEL_SCHEMA, extract_metrics, is_complete
from harness.gate.rules import RULES, Rule, rule_for

BASELINE_FORMAT = 1
FAILING = {"REGRESSION", "CHANGED", "MISSING", "INCOMPLETE", "NO BASELINE"}


@dataclass
class Row:
    job: str
    metric: str
    baseline: Any
    current: Any
    delta: float | None
    rule: str
    verdict: str


def compare_value(baseline: Any, current: Any, rule: Rule, deterministic: bool) -> tuple[float | None, str]:
    """(delta, verdict) of one metric under ``rule``."""
    num = (int, float)
    delta = None
    if isinstance(baseline, num) and isinstance(current, num) and not isinstance(baseline, bool):
        delta = current - baseline
    if rule.better == "info":
        return delta, "info"
    if not deterministic and rule.noise_band is None:
        return delta, "info"
    if delta is None:  # None (no data, e.g. no multi-token outputs) or a non-number
        return None, "pass" if baseline == current else "CHANGED"
    if deterministic:
        tol = max(rule.abs_tol, rule.rel_tol * abs(baseline))
    else:
        tol = rule.noise_band * abs(baseline)
    tol += 1e-12 * max(1.0, abs(baseline))  # float noise of the rounding in results.json
    if isinstance(delta, float) and math.isnan(delta):
        return None, "CHANGED"
    if abs(delta) <= tol:
        return delta, "pass"
    if rule.better == "equal":
        return delta, "CHANGED"
    better = delta > 0 if rule.better == "higher" else delta < 0
    return delta, "improved" if better else "REGRESSION"


def compare(current: dict[str, dict], baseline: dict, rules: Iterable[Rule] = RULES) -> list[Row]:
    """Rows for every job in ``current`` ({key: results}) against ``baseline`` (file data)."""
    rules = tuple(rules)
    rows: list[Row] = []
    base_jobs = baseline.get("jobs", {})
    for key, results in current.items():
        deterministic = results.get("executor") == "sim"
        # NOTE: on CPU the kernel benchmark times torch's reference paths, whose ratios move
        # by tens of percent between identical runs: reported, never gated
        cpu_timings = results.get("schema") == KERNEL_SCHEMA and results.get("timings") == "cpu"
        if not is_complete(results):
            reason = ("the kernel sweep's time budget ran out" if results.get("truncated") else
                      results.get("stop_reason") or "some system did not finish")
            rows.append(Row(key, "run.complete", True, False, None, "must be true",
                            "INCOMPLETE"))
            print(f"gate: {key}: results are incomplete ({reason}); re-run to completion",
                  file=sys.stderr)
        base = base_jobs.get(key)
        if base is None:
            rows.append(Row(key, "(job)", None, None, None, "baseline must exist",
                            "NO BASELINE"))
            continue
        if base.get("config_hash") and results.get("config_hash") not in (None, base["config_hash"]):
            print(f"gate: note: {key}: the resolved config differs from the baseline's "
                  "(config_hash); differences below may come from the config", file=sys.stderr)
        metrics = extract_metrics(results)
        base_metrics = base.get("metrics", {})
        for metric in list(base_metrics) + [m for m in metrics if m not in base_metrics]:
            rule = rule_for(metric, rules)
            if rule is None:
                continue
            if cpu_timings:
                rule = replace(rule, better="info")
            if metric not in metrics:
                rows.append(Row(key, metric, base_metrics[metric], None, None,
                                rule.describe(deterministic), "MISSING"))
                continue
            if metric not in base_metrics:
                rows.append(Row(key, metric, None, metrics[metric], None,
                                rule.describe(deterministic), "new"))
                continue
            delta, verdict = compare_value(base_metrics[metric], metrics[metric], rule,
                                           deterministic)
            rows.append(Row(key, metric, base_metrics[metric], metrics[metric], delta,
                            rule.describe(deterministic), verdict))
    for key in base_jobs:
        if key not in current:
            rows.append(Row(key, "(job)", "present", None, None, "every baseline job must run",
                            "MISSING"))
    return rows


def make_baseline(current: dict[str, dict], rules: Iterable[Rule] = RULES) -> dict:
    rules = tuple(rules)
    jobs = {}
    for key in sorted(current):
        results = current[key]
        metrics = {m: v for m, v in extract_metrics(results).items() if rule_for(m, rules)}
        jobs[key] = {"executor": results.get("executor", results.get("timings")),
                     "config_hash": results.get("config_hash"), "metrics": metrics}
    return {"pagebench_baseline": BASELINE_FORMAT,
            "note": "written by `python -m harness.gate ... --update`; review the diff",
            "jobs": jobs}
