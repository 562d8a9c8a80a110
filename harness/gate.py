"""Regression gate: compare result files with a committed baseline, metric by metric.

    python -m harness.gate RESULTS... --baseline baselines/smoke.json [--out DIR]
    python -m harness.gate RESULTS... --baseline baselines/smoke.json --update
    python -m harness.gate --show-rules            # the rules below, as JSON

RESULTS are ``results.json`` files (serving runs), ``kernel_results.json`` files
(``run=kernels``), run directories, or sweep directories (searched for both). Each
run is a *job*, identified by its workload, size, model, hardware, block size and
seed and executor (kernel runs: by device); the baseline holds one entry per job.

Every gated number is matched by the first rule in ``RULES`` whose pattern fits its
name: ``<system>.<path in results.json>``, ``ratio.<paged>/<contiguous>.<path>`` for
within-run ratios, ``kernel.<head>/<dtype>/b<batch>/ctx<context>/bs<block>.<ratio>``
for kernel sweep points. A rule says which direction is better and how much change
is tolerated:

- on the ``sim`` executor every figure is deterministic for a seed, so the tolerance
  is tight (``abs_tol``, or ``rel_tol`` times the baseline value, whichever is larger);
- on a measured executor (``torch``) only rules with a ``noise_band`` are gated, as a
  relative band; absolute timings have none (they depend on the machine) and are
  reported as ``info``, while ratios measured within one run (paged vs contiguous
  throughput, kernel time, kernel vs copy bandwidth) are gated;
- kernel results timed on a CPU (torch's reference paths, not the Triton kernels) are
  reported as ``info``: their ratios move by tens of percent between identical runs.

Verdicts: ``pass``, ``improved`` (better beyond tolerance: passes; refresh the
baseline with ``--update``), ``REGRESSION`` (worse beyond tolerance), ``CHANGED`` (a
figure with no better direction moved), ``MISSING`` (in the baseline, not in the
results), ``new`` (not in the baseline), ``info`` (reported, not gated). Any
REGRESSION / CHANGED / MISSING, an incomplete run, or a job with no baseline makes
the exit status 1; a bad input file exits with 2 and names the file, and so does a
gate that would check nothing (no rule matches a metric). ``--update`` refuses (2) to
overwrite a baseline it cannot read, since it keeps that baseline's other jobs.

Use your own rules with ``--rules FILE`` (a JSON list in the format ``--show-rules``
prints).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterable

from harness.errors import InputError, PagebenchError
from harness.results import PREVIOUS_DIR, atomic_write_text, read_results, write_json

BASELINE_FORMAT = 1


@dataclass(frozen=True)
class Rule:
    """How one family of metrics is gated (``metric`` is an fnmatch pattern)."""

    metric: str
    better: str  # "higher" | "lower" | "equal" (any move is a change) | "info" (never gated)
    abs_tol: float = 0.0  # sim executor: allowed |current - baseline|
    rel_tol: float = 0.0  # sim executor: ... or this fraction of |baseline|, if larger
    noise_band: float | None = None  # measured executors: relative band; None = not gated
    why: str = ""

    def describe(self, deterministic: bool) -> str:
        if self.better == "info":
            return "info"
        direction = {"higher": "higher better", "lower": "lower better",
                     "equal": "no change"}[self.better]
        if deterministic:
            parts = []
            if self.abs_tol or not self.rel_tol:
                parts.append(f"±{self.abs_tol:g}")
            if self.rel_tol:
                parts.append(f"±{self.rel_tol:.0e} rel")
            return f"{direction}, {' or '.join(parts)} (sim)"
        if self.noise_band is None:
            return "info (timing: no noise band)"
        return f"{direction}, ±{self.noise_band:.0%} noise band"


_MEM = "deterministic on sim; percent of capacity, step-weighted (results round to 1e-4)"
_SIMTIME = "simulated time on sim (deterministic); depends on the machine when measured"
_RATIO = "paged vs contiguous measured in the same run: machine speed cancels"

#: The gate's rules, first match wins. Edit a copy with --show-rules / --rules.
RULES: tuple[Rule, ...] = (
    Rule("*.memory.token_states_pct", "higher", abs_tol=0.01, why=_MEM),
    Rule("*.memory.reserved_pct", "lower", abs_tol=0.01, why=_MEM),
    Rule("*.memory.internal_fragmentation_pct", "lower", abs_tol=0.01, why=_MEM),
    Rule("*.memory.external_fragmentation_pct", "lower", abs_tol=0.01, why=_MEM),
    Rule("*.memory.sharing_savings_pct", "higher", abs_tol=0.01, why=_MEM),
    Rule("*.memory.idle_pct", "info", why="the complement of the gated categories"),
    Rule("*.batch.mean_seqs", "higher", abs_tol=0.01, why="step-weighted mean batch size"),
    Rule("*.batch.max_seqs", "higher", abs_tol=0, why="deterministic count"),
    Rule("*.preemptions", "lower", abs_tol=0, why="deterministic count"),
    Rule("*.swaps", "lower", abs_tol=0, why="deterministic count"),
    Rule("*.prefix_cache.hit_rate", "higher", abs_tol=1e-4, why="fraction of prompt tokens"),
    Rule("*.requests.finished", "higher", abs_tol=0, why="deterministic count"),
    Rule("*.requests.rejected", "lower", abs_tol=0, why="deterministic count"),
    Rule("*.requests.unfinished", "lower", abs_tol=0, why="deterministic count"),
    Rule("ratio.*.throughput.output_tokens_per_s", "higher", rel_tol=1e-4, noise_band=0.10,
         why=_RATIO),
    Rule("ratio.*.latency.e2e_s.p50", "lower", rel_tol=1e-4, noise_band=0.10, why=_RATIO),
    Rule("kernel.*.paged_over_contiguous", "lower", noise_band=0.10,
         why="paged / contiguous kernel time, measured back to back in one run"),
    Rule("kernel.*.paged_frac_copy_bw", "higher", noise_band=0.10,
         why="paged kernel bandwidth / device copy bandwidth, measured in one run"),
    Rule("*.throughput.requests_per_s", "higher", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.throughput.output_tokens_per_s", "higher", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.ttft_s.p50", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.ttft_s.p99", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.tpot_s.p50", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.e2e_s.p50", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.e2e_s.p99", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.normalized_s_per_token.p50", "lower", rel_tol=1e-4, why=_SIMTIME),
)

# The per-system paths gated (each matched by a rule above) and the ratio paths.
SYSTEM_PATHS = (
    "memory.token_states_pct", "memory.reserved_pct", "memory.internal_fragmentation_pct",
    "memory.external_fragmentation_pct", "memory.idle_pct", "memory.sharing_savings_pct",
    "batch.mean_seqs", "batch.max_seqs", "preemptions", "swaps", "prefix_cache.hit_rate",
    "requests.finished", "requests.rejected", "requests.unfinished",
    "throughput.requests_per_s", "throughput.output_tokens_per_s",
    "latency.ttft_s.p50", "latency.ttft_s.p99", "latency.tpot_s.p50", "latency.e2e_s.p50",
    "latency.e2e_s.p99", "latency.normalized_s_per_token.p50",
)
RATIO_PATHS = ("throughput.output_tokens_per_s", "latency.e2e_s.p50")
# kernel_results.json (python -m harness run=kernels): within-run ratios per sweep point.
KERNEL_SCHEMA = "pagebench.kernel_bench/1"
KERNEL_RATIOS = ("paged_over_contiguous", "paged_frac_copy_bw")
FAILING = {"REGRESSION", "CHANGED", "MISSING", "INCOMPLETE", "NO BASELINE"}


# ------------------------------------------------------------------ metrics
def _get(tree: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


_ABSENT = object()


def job_key(results: dict) -> str:
    """A readable identity of the run, stable across code changes."""
    if results.get("schema") == KERNEL_SCHEMA:  # timings: only comparable on the same device
        return f"kernels/{results.get('device', {}).get('name', '?')}"
    w, m = results.get("workload", {}), results.get("model", {})
    hw = results.get("hardware", {})
    return (f"{w.get('name', '?')}/n{w.get('num_requests', '?')}/{m.get('name', '?')}/"
            f"{hw.get('name', '?')}/bs{results.get('block_size', '?')}/seed{results.get('seed', '?')}/"
            f"{results.get('executor', '?')}")


def extract_metrics(results: dict) -> dict[str, Any]:
    """The gated numbers of one results file, by metric name (insertion-ordered)."""
    if results.get("schema") == KERNEL_SCHEMA:
        return _kernel_metrics(results)
    systems = results["systems"]
    out: dict[str, Any] = {}
    for name, summary in systems.items():
        for path in SYSTEM_PATHS:
            value = _get(summary, path)
            if value is not _ABSENT:
                out[f"{name}.{path}"] = value
    kinds = {name: _get(s, "allocator.kind") for name, s in systems.items()}
    for a, kind_a in kinds.items():
        if kind_a != "paged":
            continue
        for b, kind_b in kinds.items():
            if kind_b != "contiguous":
                continue
            for path in RATIO_PATHS:
                x, y = _get(systems[a], path), _get(systems[b], path)
                if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y:
                    out[f"ratio.{a}/{b}.{path}"] = round(x / y, 6)
    return out


def _kernel_metrics(results: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for row in results["rows"]:
        point = (f"{row.get('head_config')}/{row.get('dtype')}/b{row.get('batch')}/"
                 f"ctx{row.get('context_len')}/bs{row.get('block_size')}")
        for name in KERNEL_RATIOS:
            if row.get(name) is not None:
                out[f"kernel.{point}.{name}"] = row[name]
    return out


def rule_for(metric: str, rules: Iterable[Rule]) -> Rule | None:
    for rule in rules:
        if fnmatch.fnmatchcase(metric, rule.metric):
            return rule
    return None


# ---------------------------------------------------------------- comparing
def is_complete(results: dict) -> bool:
    if results.get("schema") == KERNEL_SCHEMA:
        return not results.get("truncated", False)
    return results.get("complete") is True


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


# ------------------------------------------------------------------- inputs
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


def _read_json(path: Path, missing: str) -> Any:
    """The JSON data in ``path``; an InputError naming it (``missing`` if it does not exist)
    when it cannot be read or is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(missing, path=str(path)) from None
    except IsADirectoryError:
        raise InputError("is a directory; pass a JSON file", path=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read it: {exc.strerror}", path=str(path)) from None
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text (not a JSON file?)", path=str(path)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON (truncated?): {exc.msg}", path=str(path),
                         line=exc.lineno) from None


def _finite(value: Any) -> bool:
    """A finite int or float (not a bool, not NaN or infinity)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def read_any_results(path: Path) -> dict:
    """A serving results.json (validated by ``read_results``) or a kernel_results.json."""
    if path.name != "kernel_results.json":
        return read_results(path)
    data = _read_json(path, "results file not found")
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
    data = _read_json(path, "baseline not found; create it with --update (then review and "
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
    data = _read_json(path, "rules file not found")
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


# ------------------------------------------------------------------ output
def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _fmt_delta(row: Row) -> str:
    if row.delta is None:
        return "-"
    text = f"{row.delta:+.4g}"
    if isinstance(row.baseline, (int, float)) and row.baseline:
        text += f" ({row.delta / abs(row.baseline):+.2%})"
    return text


HEADER = ("metric", "baseline", "current", "delta", "rule", "verdict")


def _cells(row: Row) -> tuple[str, ...]:
    return (row.metric, _fmt(row.baseline), _fmt(row.current), _fmt_delta(row), row.rule,
            row.verdict)


def _by_job(rows: list[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.job, []).append(row)
    return groups


def table_lines(rows: list[Row]) -> list[str]:
    """A plain-text table per job, columns aligned across jobs."""
    cells = [HEADER] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]

    def line(c: tuple[str, ...]) -> str:
        return "  " + "  ".join(c[i].ljust(widths[i]) for i in range(len(HEADER))).rstrip()

    lines: list[str] = []
    for job, group in _by_job(rows).items():
        lines += [f"{job}:", line(HEADER), "  " + "  ".join("-" * w for w in widths)]
        lines += [line(_cells(r)) for r in group]
    return lines


def markdown(rows: list[Row], passed: bool) -> str:
    """The report as markdown: failing rows first, then one table per job."""
    failing = [r for r in rows if r.verdict in FAILING]
    out = [f"## pagebench gate: {'PASS' if passed else 'FAIL'}", "",
           f"{len(rows)} checks over {len(_by_job(rows))} jobs, {len(failing)} failing, "
           f"{sum(r.verdict == 'improved' for r in rows)} improved.", ""]
    sections = ([("Failing", failing)] if failing else []) + list(_by_job(rows).items())
    for title, group in sections:
        out += [f"### {title}", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        for r in group:
            metric, *rest = _cells(r)
            if title == "Failing":
                metric = f"{r.job}: {metric}"
            verdict = f"**{r.verdict}**" if r.verdict in FAILING else r.verdict
            out.append("| " + " | ".join([f"`{metric}`", *rest[:-1], verdict]) + " |")
        out.append("")
    return "\n".join(out)


def write_report(rows: list[Row], passed: bool, out_dir: Path) -> None:
    write_json(out_dir / "gate.json", {"passed": passed, "rows": [asdict(r) for r in rows]})
    atomic_write_text(out_dir / "gate.md", markdown(rows, passed))


# --------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.gate",
        description="Gate pagebench results against a committed baseline (exit 0 pass, 1 a "
                    "regression, 2 a bad input file).")
    parser.add_argument("results", nargs="*", help="results.json files, run or sweep directories")
    parser.add_argument("--baseline", help="baseline JSON file (e.g. baselines/smoke.json)")
    parser.add_argument("--update", action="store_true",
                        help="write (or rewrite) the baseline from these results")
    parser.add_argument("--out", default="gate-report",
                        help="directory for gate.json and gate.md (default: gate-report)")
    parser.add_argument("--rules", help="JSON rules file replacing the defaults (see --show-rules)")
    parser.add_argument("--show-rules", action="store_true", help="print the rules as JSON")
    parser.add_argument("--failures-only", action="store_true",
                        help="print only failing and improved rows (the files keep all)")
    return parser


def update_baseline(current: dict[str, dict], path: Path, rules: tuple[Rule, ...],
                    failures_only: bool) -> None:
    """Write the baseline from ``current`` (complete results). Against an existing one:
    print what changes, say how many failing checks it accepts, and keep its jobs that
    ``current`` does not cover."""
    new = make_baseline(current, rules)
    try:
        old = load_baseline(path) if path.exists() else None
    except InputError as exc:  # replacing it would lose its other jobs
        raise InputError(f"{exc}; --update keeps a baseline's other jobs, so it does not "
                         "overwrite one it cannot read: fix it, or delete it to start afresh"
                         ) from None
    if old is not None:
        rows = [r for r in compare(current, old, rules) if r.metric != "(job)"]
        for line in table_lines(_shown(rows, failures_only)):
            print(line)
        accepted = sum(r.verdict in FAILING for r in rows)
        if accepted:
            print(f"gate: the new baseline accepts {accepted} failing checks (above)")
        kept = sorted(set(old.get("jobs", {})) - set(new["jobs"]))
        if kept:
            new["jobs"] = dict(sorted({**new["jobs"], **{k: old["jobs"][k] for k in kept}}.items()))
            print(f"gate: kept {len(kept)} baseline jobs these results do not cover: "
                  f"{', '.join(kept)} (delete the file to start afresh)")
    write_json(path, new)
    print(f"gate: wrote baseline {path} ({len(new['jobs'])} jobs, "
          f"{sum(len(j['metrics']) for j in new['jobs'].values())} metrics)")


def _shown(rows: list[Row], failures_only: bool) -> list[Row]:
    """The rows to print: all, or (``--failures-only``) those neither passing nor info."""
    return [r for r in rows if not failures_only or r.verdict not in ("pass", "info")]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rules = load_rules(Path(args.rules)) if args.rules else RULES
        if args.show_rules:
            print(json.dumps([asdict(r) for r in rules], indent=2))
            return 0
        if not args.results or not args.baseline:
            print("error: give RESULTS... and --baseline FILE (see --help)", file=sys.stderr)
            return 2
        current = load_current(args.results)
        baseline_path = Path(args.baseline)
        if args.update:
            incomplete = [k for k, r in current.items() if not is_complete(r)]
            if incomplete:
                print(f"error: refusing to write a baseline from incomplete results: "
                      f"{', '.join(incomplete)}", file=sys.stderr)
                return 2
            update_baseline(current, baseline_path, rules, args.failures_only)
            return 0
        rows = compare(current, load_baseline(baseline_path), rules)
        if not rows:  # (a missing or incomplete job gives a row)
            raise InputError("0 checks made: no rule matches a metric of these results or of "
                             "the baseline, and a gate that checks nothing does not pass",
                             path=args.rules)
    except PagebenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    passed = not any(r.verdict in FAILING for r in rows)
    for line in table_lines(_shown(rows, args.failures_only)) or [
            "(every check passed; see the report for the table)"]:
        print(line)
    write_report(rows, passed, Path(args.out))
    failing = sum(r.verdict in FAILING for r in rows)
    print(f"gate: {'PASS' if passed else 'FAIL'}: {len(rows)} checks over {len(current)} jobs, "
          f"{failing} failing, {sum(r.verdict == 'improved' for r in rows)} improved "
          f"(report: {Path(args.out) / 'gate.md'})")
    return 0 if passed else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
        sys.exit(1)
