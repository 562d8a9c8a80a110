"""Render a run directory's results into one self-contained ``report.html``."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from harness.results import atomic_write_text, read_results
from reports.figures import (breakdown_bars, line_over_time, memory_timelines, system_colors,
                             to_data_uri)

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.25em .55em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
img{max-width:100%;display:block;margin:.5em 0}.meta{color:#555;font-size:.9em}
.note{background:#fff8e1;border-left:3px solid #ffb300;padding:.4em .8em}
"""


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return html.escape(str(value))


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def summary_rows(systems: dict[str, dict]) -> tuple[list[str], list[list]]:
    """The headline table: one row per system."""
    header = ["system", "token states %", "reserved %", "internal frag %", "external frag %",
              "idle %", "sharing savings %", "prefix hit rate", "mean batch", "max batch",
              "req/s", "output tok/s", "TTFT p50 (s)", "TPOT p50 (s)", "e2e p99 (s)",
              "norm. latency (s/token)", "preemptions", "rejected"]
    rows = []
    for name, s in systems.items():
        m, lat = s["memory"], s["latency"]
        rows.append([name, m["token_states_pct"], m["reserved_pct"], m["internal_fragmentation_pct"],
                     m["external_fragmentation_pct"], m["idle_pct"], m["sharing_savings_pct"],
                     s["prefix_cache"]["hit_rate"], s["batch"]["mean_seqs"], s["batch"]["max_seqs"],
                     s["throughput"]["requests_per_s"], s["throughput"]["output_tokens_per_s"],
                     lat["ttft_s"]["p50"], lat["tpot_s"]["p50"], lat["e2e_s"]["p99"],
                     lat["normalized_s_per_token"]["mean"], s["preemptions"],
                     s["requests"]["rejected"]])
    return header, rows


def render_run_report(run_dir: Path) -> Path:
    """Write ``run_dir/report.html`` from the results and step tables found there."""
    run_dir = Path(run_dir)
    results = read_results(run_dir / "results.json")
    systems = results["systems"]
    names = list(systems)
    colors = system_colors(names)
    steps = {n: pd.read_csv(run_dir / f"steps_{n}.csv") for n in names
             if (run_dir / f"steps_{n}.csv").exists()}
    capacity = {n: systems[n]["memory"]["capacity_slots"] for n in names}
    parts = [f"<h1>pagebench report: {html.escape(results['workload'].get('name', ''))}</h1>"]
    meta = (f"workload <b>{html.escape(str(results['workload'].get('name')))}</b> · model "
            f"<b>{html.escape(results['model']['name'])}</b> · hardware "
            f"<b>{html.escape(results['hardware']['name'])}</b> · executor "
            f"<b>{html.escape(results['executor'])}</b> · seed {results['seed']} · block size "
            f"{results['block_size']} · KV capacity {results['capacity_slots']:,} slots · "
            f"pagebench {html.escape(results['pagebench_version'])}")
    parts.append(f"<p class='meta'>{meta}</p>")
    if not results.get("complete", True):
        parts.append("<p class='note'>This run is incomplete "
                     f"({html.escape(str(results.get('stop_reason', 'stopped early')))}): "
                     "figures cover what finished.</p>")
    header, rows = summary_rows(systems)
    parts.append("<h2>Summary</h2>" + _table(header, rows))
    if systems:
        parts.append("<h2>Memory</h2>")
        parts.append(f"<img alt='memory breakdown per system' src='{to_data_uri(breakdown_bars(systems))}'>")
    if steps:
        parts.append(f"<img alt='memory over time' src='{to_data_uri(memory_timelines(steps, capacity))}'>")
        extent = line_over_time(steps, "largest_free_extent", "largest free extent (% of pool)",
                                "Largest free extent", colors,
                                {n: 100.0 / capacity[n] for n in steps})
        parts.append(f"<img alt='largest free extent' src='{to_data_uri(extent)}'>")
        parts.append("<h2>Serving</h2>")
        batch = line_over_time(steps, "num_seqs", "running sequences", "Batch size over time", colors)
        parts.append(f"<img alt='batch size over time' src='{to_data_uri(batch)}'>")
    workload_rows = [[k, v] for k, v in results["workload"].items() if not isinstance(v, (dict, list))]
    parts.append("<h2>Workload</h2>" + _table(["field", "value"], workload_rows))
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>pagebench report</title><style>{_STYLE}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")
    out = run_dir / "report.html"
    atomic_write_text(out, page)
    return out
