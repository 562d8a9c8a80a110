"""The kernel benchmark's outputs: summaries, the H200 targets, JSON / CSV / markdown files."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path



def summarize(rows: list[dict]) -> dict:
    """Per head config: paged/contiguous ratio range and the largest end-to-end share."""
    out = {}
    for name in sorted({r["head_config"] for r in rows}):
        mine = [r for r in rows if r["head_config"] == name]
        ratios = [r["paged_over_contiguous"] for r in mine if r["paged_over_contiguous"] is not None]
        shares = [r["indirection_share"] for r in mine if r["indirection_share"] is not None]
        fracs = [r["paged_frac_copy_bw"] for r in mine if r["paged_frac_copy_bw"] is not None]
        out[name] = {
            "points": len(mine),
            "paged_over_contiguous": _stats(ratios),
            "indirection_share": _stats(shares),
            "paged_frac_copy_bw_max": max(fracs) if fracs else None,
            "errors": sum(1 for r in mine if r["errors"]),
        }
    return out


def _stats(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def check_targets(rows: list[dict]) -> dict:
    """The issue's H200 targets, evaluated on what was measured (None = not measured)."""
    def sel(**kw):
        return [r for r in rows if all(r[k] == v for k, v in kw.items())]

    big = [r for r in sel(dtype="float16", block_size=16)
           if r["batch"] >= 32 and r["context_len"] >= 4096 and r["paged_frac_copy_bw"] is not None]
    bs16 = [r for r in sel(block_size=16) if r["paged_over_contiguous"] is not None]
    spread = []
    for r in rows:
        if 8 <= r["block_size"] <= 128 and r["paged_ms"] is not None:
            ref = [x for x in sel(head_config=r["head_config"], dtype=r["dtype"], batch=r["batch"],
                                  context_len=r["context_len"], block_size=16) if x["paged_ms"]]
            if ref:
                spread.append(r["paged_ms"] / ref[0]["paged_ms"])
    flex = [r["paged_over_flex"] for r in rows if r["paged_over_flex"] is not None]

    def verdict(values, ok):
        return {"measured": _stats(values), "met": None if not values else all(ok(v) for v in values)}

    return {
        "paged_frac_copy_bw>=0.90 (fp16, block 16, batch>=32, context>=4096)":
            verdict([r["paged_frac_copy_bw"] for r in big], lambda v: v >= 0.90),
        "paged/contiguous<=1.03 (block 16)": verdict([r["paged_over_contiguous"] for r in bs16], lambda v: v <= 1.03),
        "paged time within 5% of block 16 (blocks 8..128)": verdict(spread, lambda v: abs(v - 1) <= 0.05),
        "paged/flex<=1.0": verdict(flex, lambda v: v <= 1.0),
    }


CSV_FIELDS = [
    "head_config", "num_heads", "num_kv_heads", "head_dim", "dtype", "batch", "context_len", "block_size",
    "num_splits", "tile_size", "paged_ms", "contiguous_ms", "reference_ms", "sdpa_ms", "flex_ms", "kv_bytes",
    "io_bytes", "bytes", "paged_GBps", "contiguous_GBps", "paged_frac_copy_bw", "contiguous_frac_copy_bw",
    "paged_over_contiguous", "paged_over_flex", "paged_over_sdpa", "num_layers", "linear_ms",
    "linear_roofline_ms", "step_ms", "indirection_ms_per_step", "indirection_share",
    "paged_vs_sdpa_max_abs", "contiguous_vs_sdpa_max_abs", "flex_vs_sdpa_max_abs", "errors",
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
        *([f"**Truncated**: the time budget ran out; {len(results['rows'])} points measured.", ""]
          if results.get("truncated") else []),
        f"- date: {results['date']}",
        f"- device: {dev.get('name')} ({dev.get('type')})",
        f"- torch {results['versions']['torch']}, triton {results['versions']['triton']}",
        f"- copy bandwidth: {results['copy_bandwidth_GBps']:.1f} GB/s",
        f"- timing: {results['method']['timing']}; paged: {results['method']['paged_impl']}",
        "",
        "| heads | dtype | batch | context | block | splits | paged ms | contig ms | paged/contig | "
        "paged GB/s | frac copy bw | ref ms | sdpa ms | flex ms | e2e share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lines.append("| " + " | ".join([
            r["head_config"], r["dtype"], str(r["batch"]), str(r["context_len"]), str(r["block_size"]),
            _fmt(r["num_splits"]), _fmt(r["paged_ms"]), _fmt(r["contiguous_ms"]), _fmt(r["paged_over_contiguous"], 4),
            _fmt(r["paged_GBps"], 4), _fmt(r["paged_frac_copy_bw"]), _fmt(r["reference_ms"]), _fmt(r["sdpa_ms"]),
            _fmt(r["flex_ms"]), _fmt(r["indirection_share"], 2),
        ]) + " |")
    if results.get("targets"):
        lines += ["", "## Targets (measured, not asserted)", ""]
        for name, verdict in results["targets"].items():
            lines.append(f"- {name}: met={verdict['met']}, measured={verdict['measured']}")
    errors = [r for r in results["rows"] if r["errors"]]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- {r['head_config']} {r['dtype']} b{r['batch']} L{r['context_len']} bs{r['block_size']}: "
                  f"{r['errors']}" for r in errors]
    return "\n".join(lines) + "\n"
