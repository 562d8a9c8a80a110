"""The kernel benchmark's outputs: the point log, rows, summaries, the H200 targets, and the
JSON / CSV / markdown files built from the log.

``kernel_points.jsonl`` holds one JSON object per line, each flushed as it is written: a
``header`` (device, versions, method, spec, planned points, estimate), the ``ceilings``
(copy and read bandwidth), one ``point`` per measured point, ``flex`` records (merged
into their points), a ``phase`` record per phase (estimated and actual seconds) and an
``end`` record. ``results_from_log`` turns whatever the log holds -- also the log of a
killed run, whose last line may be cut -- into the ``kernel_results.json`` document.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from pathlib import Path

from harness.errors import ConfigError

POINTS_FILE = "kernel_points.jsonl"


def _finite(value):
    """JSON-safe: non-finite floats become None (recursively)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class PointLog:
    """Append-only JSONL; each record is flushed to disk before ``write`` returns."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fh = open(self.path, "w")

    def write(self, record: dict) -> None:
        self.fh.write(json.dumps(_finite(record), allow_nan=False, default=str) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def __enter__(self) -> PointLog:
        return self

    def __exit__(self, *exc) -> None:
        self.fh.close()


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _ms(timing) -> float | None:
    return None if timing is None else timing.ms


def _launch_us(timing) -> float | None:
    return None if timing is None else timing.launch_us


def row_of(head, dtype_name: str, itemsize: int, batch: int, context: int, block_size: int, plan, times: dict,
           ceilings: dict, linear_ms, linear_roofline_ms, errors: dict, baseline_errors: dict | None = None) -> dict:
    """One measured point with its derived figures (bytes, bandwidths and fractions, ratios, e2e share).

    ``times`` maps paged / contiguous / sdpa / reference to ``bench_timing.Timing`` (or None):
    ``*_ms`` is the headline figure (graph-timed on CUDA), ``*_launch_us`` the eager one."""
    kv_bytes = 2 * batch * context * head.num_kv_heads * head.head_dim * itemsize
    io_bytes = 2 * batch * head.num_heads * head.head_dim * itemsize
    nbytes = kv_bytes + io_bytes
    paged, contig = _ms(times.get("paged")), _ms(times.get("contiguous"))
    sdpa = _ms(times.get("sdpa"))

    def gbps(ms):
        return None if ms is None else nbytes / (ms * 1e-3) / 1e9

    copy_bw, read_bw = ceilings.get("copy_bandwidth_GBps"), ceilings.get("read_bandwidth_GBps")
    layers = head.num_layers
    step_ms = indirection_ms = share = None
    if layers and paged is not None and linear_ms is not None:
        step_ms = layers * (paged + linear_ms)
        if contig is not None:
            indirection_ms = layers * (paged - contig)
            share = indirection_ms / step_ms
    return {
        "head_config": head.name, "num_heads": head.num_heads, "num_kv_heads": head.num_kv_heads,
        "head_dim": head.head_dim, "dtype": dtype_name, "batch": batch, "context_len": context,
        "block_size": block_size, "num_splits": plan.num_splits if plan else None,
        "tile_size": (times.get("paged_config") or {}).get("tile_n"),
        "paged_config": times.get("paged_config"), "contiguous_config": times.get("contiguous_config"),
        "paged_ms": paged, "contiguous_ms": contig, "reference_ms": _ms(times.get("reference")),
        "sdpa_ms": sdpa, "sdpa_backend": times.get("sdpa_backend"), "sdpa_backends": times.get("sdpa_backends"),
        "flex_ms": None, "flex_vs_sdpa_max_abs": None,
        "paged_launch_us": _launch_us(times.get("paged")), "contiguous_launch_us": _launch_us(times.get("contiguous")),
        "sdpa_launch_us": _launch_us(times.get("sdpa")), "flex_launch_us": None,
        "paged_graph_spread": None if times.get("paged") is None else times["paged"].spread,
        "kv_bytes": kv_bytes, "io_bytes": io_bytes, "bytes": nbytes,
        "paged_GBps": gbps(paged), "contiguous_GBps": gbps(contig),
        "paged_frac_copy_bw": _ratio(gbps(paged), copy_bw), "contiguous_frac_copy_bw": _ratio(gbps(contig), copy_bw),
        "paged_frac_read_bw": _ratio(gbps(paged), read_bw), "contiguous_frac_read_bw": _ratio(gbps(contig), read_bw),
        "paged_over_contiguous": _ratio(paged, contig), "paged_over_flex": None,
        "paged_over_sdpa": _ratio(paged, sdpa),
        "num_layers": layers, "linear_ms": linear_ms, "linear_roofline_ms": linear_roofline_ms,
        "step_ms": step_ms, "indirection_ms_per_step": indirection_ms, "indirection_share": share,
        "errors": "; ".join(f"{k}: {v}" for k, v in errors.items()) or None,
        "baseline_errors": "; ".join(f"{k}: {v}" for k, v in (baseline_errors or {}).items()) or None,
    }


def read_log(path: Path) -> list[dict]:
    """The records of a point log; a last line cut by a kill is dropped."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such point log (pagebench.kernels.benchmark writes it as it measures)")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(path.read_text().splitlines()):
                raise ConfigError(f"{path}:{number}: not a JSON record") from None
    if not records or records[0].get("kind") != "header":
        raise ConfigError(f"{path}: the first record must be the run's header")
    return records


def results_from_log(path: Path) -> dict:
    """The ``kernel_results.json`` document from a point log (complete or cut short)."""
    records = read_log(path)
    header = {k: v for k, v in records[0].items() if k != "kind"}
    ceilings = next((r for r in records if r["kind"] == "ceilings"), {})
    rows = [{k: v for k, v in r.items() if k != "kind"} for r in records if r["kind"] == "point"]
    key = ("head_config", "dtype", "batch", "context_len", "block_size")
    by_key = {tuple(r[k] for k in key): r for r in rows}
    for flex in (r for r in records if r["kind"] == "flex"):
        row = by_key.get(tuple(flex[k] for k in key))
        if row is not None:
            row["flex_ms"] = flex["flex_ms"]
            row["flex_launch_us"] = flex.get("flex_launch_us")
            row["flex_vs_sdpa_max_abs"] = flex["flex_vs_sdpa_max_abs"]
            row["paged_over_flex"] = _ratio(row["paged_ms"], flex["flex_ms"])
            if flex.get("errors"):
                row["baseline_errors"] = "; ".join(e for e in (row.get("baseline_errors"), flex["errors"]) if e)
    repeats = [{k: v for k, v in r.items() if k != "kind"} for r in records if r["kind"] == "repeat"]
    end = next((r for r in records if r["kind"] == "end"), None)
    planned = sum((header.get("planned_points") or {}).values())
    results = {
        "schema": header["schema"],
        "timings": header["timings"],
        # how the CUDA figures were taken: "cuda_graph" (issue 33); absent in older files (eager do_bench)
        "kernel_timing": (header.get("method") or {}).get("kernel_timing"),
        # the run stopped before its plan ended: time budget, SIGINT, or killed (no end record)
        "truncated": end is None or bool(end["truncated"]),
        "truncated_reason": (end or {}).get("reason") or (None if end else "killed: the log has no end record"),
        "date": header["date"],
        "device": header["device"],
        "versions": header["versions"],
        "copy_bandwidth_GBps": ceilings.get("copy_bandwidth_GBps"),
        "read_bandwidth_GBps": ceilings.get("read_bandwidth_GBps"),
        "method": header["method"],
        "spec": header["spec"],
        "planned_points": header.get("planned_points"),
        "measured_points": len(rows),
        "phases": [{k: v for k, v in r.items() if k != "kind"} for r in records if r["kind"] == "phase"],
        "estimate_s": header.get("estimate_s"),
        "rows": rows,
        "summary": summarize(rows),
        "repeats": repeats,
        "targets": check_targets(rows, repeats) if header["timings"] == "cuda" else None,
    }
    if end is not None and not end["truncated"] and planned and len(rows) < planned - _flex_only(header):
        results["truncated"] = True
    return results


def _flex_only(header: dict) -> int:
    return (header.get("planned_points") or {}).get("flex", 0)



def summarize(rows: list[dict]) -> dict:
    """Per head config: paged/contiguous ratio range and the largest end-to-end share."""
    out = {}
    for name in sorted({r["head_config"] for r in rows}):
        mine = [r for r in rows if r["head_config"] == name]
        ratios = [r["paged_over_contiguous"] for r in mine if r["paged_over_contiguous"] is not None]
        shares = [r["indirection_share"] for r in mine if r["indirection_share"] is not None]
        fracs = [r["paged_frac_copy_bw"] for r in mine if r["paged_frac_copy_bw"] is not None]
        read_fracs = [r["paged_frac_read_bw"] for r in mine if r.get("paged_frac_read_bw") is not None]
        out[name] = {
            "points": len(mine),
            "paged_over_contiguous": _stats(ratios),
            "indirection_share": _stats(shares),
            "paged_frac_copy_bw_max": max(fracs) if fracs else None,
            "paged_frac_read_bw_max": max(read_fracs) if read_fracs else None,
            "errors": sum(1 for r in mine if r["errors"]),
        }
    return out


def _stats(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def check_targets(rows: list[dict], repeats: list[dict] | None = None) -> dict:
    """Issue 33's H200 targets, evaluated on what was measured (``met`` None = not measured).

    ``repeats``: the ``repeat`` records (paged re-timed at block 16 after the sweep)."""
    def sel(**kw):
        return [r for r in rows if all(r[k] == v for k, v in kw.items())]

    big = [r for r in sel(dtype="float16", block_size=16) if r["batch"] >= 32 and r["context_len"] >= 4096]
    batch8 = [r["paged_over_sdpa"] for r in rows if r["batch"] >= 8 and r["paged_over_sdpa"] is not None]
    batch1 = [r["paged_over_sdpa"] for r in rows
              if r["batch"] == 1 and 1024 <= r["context_len"] <= 8192 and r["paged_over_sdpa"] is not None]
    spread = []
    for r in rows:
        if 8 <= r["block_size"] <= 128 and r["paged_ms"] is not None:
            ref = [x for x in sel(head_config=r["head_config"], dtype=r["dtype"], batch=r["batch"],
                                  context_len=r["context_len"], block_size=16) if x["paged_ms"]]
            if ref:
                spread.append(r["paged_ms"] / ref[0]["paged_ms"])
    by_key = {(r["head_config"], r["dtype"], r["batch"], r["context_len"], r["block_size"]): r for r in rows}
    again = []
    for rep in repeats or []:
        first = by_key.get((rep["head_config"], rep["dtype"], rep["batch"], rep["context_len"], rep["block_size"]))
        if first and first["paged_ms"] and rep.get("paged_ms"):
            again.append(rep["paged_ms"] / first["paged_ms"])
    flex = [r["paged_over_flex"] for r in rows if r["paged_over_flex"] is not None]

    def verdict(values, ok):
        return {"measured": _stats(values), "met": None if not values else all(ok(v) for v in values)}

    return {
        "paged_frac_read_bw>=0.90 (fp16, block 16, batch>=32, context>=4096)":
            verdict([r["paged_frac_read_bw"] for r in big if r.get("paged_frac_read_bw") is not None],
                    lambda v: v >= 0.90),
        "paged/contiguous<=1.03 (fp16, block 16, batch>=32, context>=4096)":
            verdict([r["paged_over_contiguous"] for r in big if r["paged_over_contiguous"] is not None],
                    lambda v: v <= 1.03),
        "paged/best sdpa<=1.10 (batch>=8)": verdict(batch8, lambda v: v <= 1.10),
        "paged/best sdpa<=1.5 (batch 1, context 1K-8K)": verdict(batch1, lambda v: v <= 1.5),
        "repeat/first within 5% (paged, block 16, batch>=8)": verdict(again, lambda v: abs(v - 1) <= 0.05),
        "paged time within 5% of block 16 (blocks 8..128)": verdict(spread, lambda v: abs(v - 1) <= 0.05),
        "paged/flex<=1.0": verdict(flex, lambda v: v <= 1.0),
    }


CSV_FIELDS = [
    "head_config", "num_heads", "num_kv_heads", "head_dim", "dtype", "batch", "context_len", "block_size",
    "num_splits", "tile_size", "paged_config", "contiguous_config", "paged_ms", "contiguous_ms", "reference_ms",
    "sdpa_ms", "sdpa_backend", "sdpa_backends", "flex_ms", "paged_launch_us", "contiguous_launch_us",
    "sdpa_launch_us", "flex_launch_us", "paged_graph_spread", "kv_bytes",
    "io_bytes", "bytes", "paged_GBps", "contiguous_GBps", "paged_frac_copy_bw", "contiguous_frac_copy_bw",
    "paged_frac_read_bw", "contiguous_frac_read_bw",
    "paged_over_contiguous", "paged_over_flex", "paged_over_sdpa", "num_layers", "linear_ms",
    "linear_roofline_ms", "step_ms", "indirection_ms_per_step", "indirection_share",
    "paged_vs_sdpa_max_abs", "contiguous_vs_sdpa_max_abs", "flex_vs_sdpa_max_abs", "errors", "baseline_errors",
]


def write_results(results: dict, out_dir: Path) -> None:
    out_dir = Path(out_dir)
    (out_dir / "kernel_results.json").write_text(json.dumps(results, indent=2, allow_nan=False, default=str))
    with open(out_dir / "kernel_results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in results["rows"]:
            writer.writerow({k: row.get(k) for k in CSV_FIELDS})
    (out_dir / "kernel_results.md").write_text(markdown_table(results))


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if not math.isnan(value) else "nan"
    return str(value)


def markdown_table(results: dict) -> str:
    """A human-readable table of the sweep, headed by date, device and method."""
    dev = results["device"]
    lines = [
        f"# Kernel benchmark ({results['timings']} timings)",
        "",
        *([f"**Truncated** ({results.get('truncated_reason') or 'time budget'}): "
           f"{len(results['rows'])} points measured.", ""] if results.get("truncated") else []),
        f"- date: {results['date']}",
        f"- device: {dev.get('name')} ({dev.get('type')})",
        f"- torch {results['versions']['torch']}, triton {results['versions']['triton']}",
        f"- read bandwidth: {_fmt(results.get('read_bandwidth_GBps'), 4)} GB/s (the ceiling for decode); "
        f"copy bandwidth: {_fmt(results['copy_bandwidth_GBps'], 4)} GB/s",
        f"- points: {results.get('measured_points', len(results['rows']))} measured of "
        f"{sum((results.get('planned_points') or {}).values()) or '?'} planned",
        f"- timing: {results['method']['timing']}; paged: {results['method']['paged_impl']}",
        "",
        *_phase_lines(results),
        "| heads | dtype | batch | context | block | splits | config | paged ms | paged launch us | contig ms | "
        "paged/contig | paged GB/s | frac read bw | frac copy bw | ref ms | sdpa ms (backend) | paged/sdpa | "
        "flex ms | e2e share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lines.append("| " + " | ".join([
            r["head_config"], r["dtype"], str(r["batch"]), str(r["context_len"]), str(r["block_size"]),
            _fmt(r["num_splits"]), _config(r.get("paged_config")), _fmt(r["paged_ms"]), _fmt(r.get("paged_launch_us")),
            _fmt(r["contiguous_ms"]), _fmt(r["paged_over_contiguous"], 4), _fmt(r["paged_GBps"], 4),
            _fmt(r.get("paged_frac_read_bw")), _fmt(r["paged_frac_copy_bw"]), _fmt(r["reference_ms"]),
            _fmt(r["sdpa_ms"]) + (f" ({r['sdpa_backend']})" if r.get("sdpa_backend") else ""),
            _fmt(r.get("paged_over_sdpa")), _fmt(r["flex_ms"]), _fmt(r["indirection_share"], 2),
        ]) + " |")
    if results.get("targets"):
        lines += ["", "## Targets (measured, not asserted)", ""]
        for name, verdict in results["targets"].items():
            lines.append(f"- {name}: met={verdict['met']}, measured={verdict['measured']}")
    for title, field in (("Errors (measured kernels)", "errors"), ("Baselines not measured", "baseline_errors")):
        failed = [r for r in results["rows"] if r.get(field)]
        if failed:
            lines += ["", f"## {title}", ""]
            lines += [f"- {r['head_config']} {r['dtype']} b{r['batch']} L{r['context_len']} bs{r['block_size']}: "
                      f"{r[field]}" for r in failed]
    return "\n".join(lines) + "\n"


def _config(config: dict | None) -> str:
    return "-" if not config else f"t{config['tile_n']}/w{config['num_warps']}/s{config['num_stages']}"


def _phase_lines(results: dict) -> list[str]:
    phases = results.get("phases") or []
    if not phases:
        return []
    lines = ["| phase | points | estimated s | actual s |", "|---|---|---|---|"]
    lines += [f"| {p['name']} | {p['points']} | {_fmt(p.get('estimate_s'))} | {_fmt(p['actual_s'])} |" for p in phases]
    return [*lines, ""]
