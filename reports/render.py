"""Render a run directory's results into one self-contained ``report.html``.

Sections: header, summary (with a plain-words verdict of what paging bought),
memory, serving, kernels and GPU telemetry (when measured), theory and claims,
workload and run details. Every figure is an inline PNG; the file has no links
to anything outside itself.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from harness.fileio import atomic_write_text
from pagebench.reports import figures as F
from pagebench.reports.claims import FAILS, HOLDS, evaluate_claims
from pagebench.reports.figure_batch import PendingFigure, resolve
from pagebench.reports.headline import headline_sentence, load_parts
from pagebench.reports.html import Raw, absent, esc, fmt, page, table
from pagebench.reports.layer_groups import layer_group_parts
from pagebench.reports.metrics import energy_per_token_j, waste_pct
from pagebench.reports.offload_section import offload_table
from pagebench.reports.serving_metrics import serving_metrics_section
from pagebench.reports.residency_section import residency_parts
from pagebench.reports.rundata import RunData, load_run
from pagebench.reports.telemetry import telemetry_figure

NAV = "<nav></nav>"
SECTIONS = [("summary", "Summary"), ("memory", "Memory"), ("serving", "Serving"),
            ("kernels", "Kernels"), ("telemetry", "GPU telemetry"),
            ("claims", "Theory and claims"), ("workload", "Workload and run")]


def summary_rows(systems: dict[str, dict]) -> tuple[list[str], list[list]]:
    """The headline table: one row per system."""
    header = ["system", "allocator", "token states %", "waste % of used", "mean batch",
              "req/s", "output tok/s", "TTFT p50 (s)", "TPOT p50 (s)", "e2e p99 (s)",
              "norm. latency (s/token)", "preemptions", "finished", "rejected"]
    rows = []
    for name, s in systems.items():
        lat = s["latency"]
        rows.append([name, s.get("label", ""), s["memory"]["token_states_pct"], waste_pct(s),
                     s["batch"]["mean_seqs"], s["throughput"]["requests_per_s"],
                     s["throughput"]["output_tokens_per_s"], lat["ttft_s"]["p50"],
                     lat["tpot_s"]["p50"], lat["e2e_s"]["p99"],
                     lat["normalized_s_per_token"]["mean"], s["preemptions"],
                     s["requests"]["finished"], s["requests"]["rejected"]])
    return header, rows


def memory_rows(systems: dict[str, dict]) -> tuple[list[str], list[list]]:
    header = ["system", "token states %", "reserved %", "internal: over-reservation %",
              "internal: rounding %", "internal: page padding %", "external frag %", "idle %", "block-level usage %",
              "token-level usage %", "sharing savings %", "prefix hit rate %",
              "mean largest free extent (slots)", "capacity (slots)"]
    rows = []
    for name, s in systems.items():
        m = s["memory"]
        hit = (s.get("prefix_cache") or {}).get("hit_rate")
        rows.append([name, m["token_states_pct"], m["reserved_pct"],
                     m.get("internal_over_reservation_pct"), m.get("internal_rounding_pct"),
                     m.get("internal_page_padding_pct"), m["external_fragmentation_pct"], m["idle_pct"], m.get("block_level_usage_pct"),
                     m.get("token_level_usage_pct"), m.get("sharing_savings_pct"),
                     None if hit is None else 100.0 * hit,
                     m.get("mean_largest_free_extent_slots"), m["capacity_slots"]])
    return header, rows


def latency_rows(systems: dict[str, dict]) -> tuple[list[str], list[list]]:
    header = ["system"]
    keys = [("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "e2e"),
            ("normalized_s_per_token", "normalized")]
    for _, label in keys:
        header += [f"{label} p50", f"{label} p90", f"{label} p99"]
    rows = []
    for name, s in systems.items():
        row = [name]
        for key, _ in keys:
            lat = s["latency"].get(key, {})
            row += [lat.get("p50"), lat.get("p90"), lat.get("p99")]
        rows.append(row)
    return header, rows


def _name(node) -> str | None:
    return node.get("name") if isinstance(node, dict) else node


def _header(run: RunData) -> list[str]:
    r = run.results or {}
    k = run.kernel_results or {}
    info = run.run_info
    executor = r.get("executor") or k.get("executor") or "–"
    executors = [s.get("executor") for s in run.systems.values() if isinstance(s.get("executor"), dict)]
    device = (r.get("device") or info.get("device") or k.get("device")
              or next((e.get("device") for e in executors if e.get("device")), None))
    if isinstance(device, dict):
        device = device.get("name") or ", ".join(f"{a}={b}" for a, b in device.items())
    workload = (r.get("workload") or {}).get("name") or (r.get("workload") or {}).get("kind")
    fields = [
        ("workload", workload or ("kernel benchmark" if k else "–")),
        ("model", (r.get("model") or {}).get("name") or _name(k.get("model"))),
        ("hardware", (r.get("hardware") or {}).get("name") or _name(k.get("hardware"))),
        ("executor", f"{executor} on {device}" if device else executor),
        ("seed", r.get("seed", k.get("seed"))),
        ("block size", r.get("block_size")),
        ("KV capacity", f"{r['capacity_slots']:,} slots" if r.get("capacity_slots") else None),
        ("pagebench", r.get("pagebench_version") or k.get("pagebench_version")),
        ("date", info.get("created") or r.get("created") or k.get("created")),
    ]
    meta = " · ".join(f"{esc(name)} <b>{esc(value)}</b>" for name, value in fields
                      if value not in (None, ""))
    title = f"pagebench report: {workload or 'kernels'}"
    parts = [f"<h1>{esc(title)}</h1>", f"<p class='meta' id='run-meta'>{meta}</p>"]
    parts.append(NAV)  # replaced by the links to the sections the report has
    if r and not r.get("complete", True):
        parts.append("<p class='note'>This run is incomplete "
                     f"({esc(r.get('stop_reason', 'stopped early'))}): figures cover what "
                     "finished.</p>")
    for warning in (r or {}).get("warnings") or ():
        parts.append(f"<p class='note'>Warning: {esc(warning)}</p>")
    return parts


# A contiguous system's buddy rounding is worth a sentence from this share of its pool.
BUDDY_NOTE_PCT = 5.0


def buddy_rounding_notes(systems: dict[str, dict]) -> list[str]:
    """A sentence per contiguous system on a buddy arena whose rounding takes at least
    ``BUDDY_NOTE_PCT`` of its pool: why an exact (oracle) reservation can waste about as
    much as a power-of-two (pow2) one."""
    notes = []
    for name, s in systems.items():
        allocator, memory = s.get("allocator") or {}, s.get("memory") or {}
        rounding = memory.get("internal_rounding_pct")
        if (allocator.get("kind") != "contiguous" or allocator.get("arena") != "buddy"
                or not isinstance(rounding, (int, float)) or rounding < BUDDY_NOTE_PCT):
            continue
        exact = (" Its policy reserves exactly what each request will hold, so this "
                 "rounding is most of its waste, and it reads close to pow2."
                 if allocator.get("policy") == "oracle" else "")
        notes.append(f"<p class='note buddy-rounding'>{esc(name)}: {fmt(rounding)}% of the pool "
                     "is buddy rounding: the buddy arena hands out power-of-two extents, so a "
                     "reservation of 1,100 slots takes 2,048 (the 948 past it are internal "
                     f"fragmentation, 'internal: rounding %' above).{exact}</p>")
    return notes


def _memory_section(run: RunData, colors: dict[str, str]) -> list[str | PendingFigure]:
    systems, steps = run.systems, run.steps
    parts = ["<h2 id='memory'>Memory</h2>"]
    if not systems:
        return parts + [absent("Serving memory")]
    parts.append(PendingFigure(lambda: F.breakdown_bars(systems), "memory breakdown per system",
                               "Time-averaged share of the KV pool in each category. Internal "
                               "fragmentation is split into policy over-reservation, "
                               "allocator rounding (buddy power-of-two, the tail of a last "
                               "block) and page padding (a hybrid manager's unified pages)."))
    header, rows = memory_rows(systems)
    parts.append(table(header, rows, text_columns=(0,), css_id="memory-table"))
    parts += buddy_rounding_notes(systems)
    parts += layer_group_parts(systems)
    capacity = {n: systems[n]["memory"]["capacity_slots"] for n in systems}
    if steps:
        parts.append(PendingFigure(
            lambda: F.memory_timelines(steps, capacity), "memory over time",
            "Each category's share of the pool at every step (the memory the step ran with), "
            "one panel per system; the averages above weight steps by their duration."))
        scale = {n: 100.0 / capacity[n] for n in steps}
        parts.append(PendingFigure(lambda: F.line_over_time(
            steps, "largest_free_extent", "largest free extent (% of pool)",
            "Largest free extent (room for one new contiguous request)", colors, scale),
            "largest free extent over time",
            "The largest run of free slots a contiguous reservation could take; for a paged "
            "pool any free block will do, so it equals the free memory."))
        parts.append(PendingFigure(
            lambda: _usage_over_time(steps, scale, colors),
            "block-level vs token-level usage over time",
            "Allocated slots (block level) over slots holding a token's KV (token level); the "
            "band between them is allocated memory without token state. Each panel draws its "
            "band and block-level line in its system's colour (the legend's grey)."))
    else:
        parts.append(absent("Per-step timelines (no steps_<system> tables)"))
    parts.append(PendingFigure(lambda: F.panel_bars(systems, [
        ("block-level usage (% of pool)", lambda s: s["memory"].get("block_level_usage_pct")),
        ("token-level usage (% of pool)", lambda s: s["memory"].get("token_level_usage_pct")),
        ("sharing savings (% of logical)", _sharing_savings),
        ("prefix-cache hit rate (%)", _prefix_hit_rate),
    ], "Usage, sharing and prefix caching (time-averaged)", colors),
        "usage, sharing savings and prefix-cache hit rate per system",
        "Sharing savings = 1 - physical / logical token slots (a shared slot counted once per "
        "sharer); the hit rate counts prompt tokens served from the prefix cache, re-admissions "
        "after a preemption included. n/a: the system cannot share blocks (contiguous) or has "
        "no prefix cache."))
    parts += residency_parts(systems, colors)
    return parts


def _sharing_savings(summary: dict) -> float | None:
    """None (n/a) for a contiguous system: it never shares a slot."""
    if summary.get("allocator", {}).get("kind") == "contiguous":
        return None
    return summary["memory"].get("sharing_savings_pct")


def _prefix_hit_rate(summary: dict) -> float | None:
    """In %; None (n/a) for a system without a prefix cache."""
    hit_rate = (summary.get("prefix_cache") or {}).get("hit_rate")
    if not summary.get("allocator", {}).get("prefix_caching") or hit_rate is None:
        return None
    return 100.0 * hit_rate


def _usage_over_time(steps, scale, colors):
    """Per system: token-level usage (line) under block-level usage; the band is unfilled."""
    names = list(steps)
    fig, axes = F.subplots(len(names), 1, figsize=(8, 1.5 * len(names) + 0.9), sharex=True,
                           squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        sub = F._thin(steps[name])
        block = sub["allocated_slots"] * scale[name]
        token = sub["token_states"] * scale[name]
        ax.fill_between(sub["time_s"], token, block, step="post", color=colors[name], alpha=0.3,
                        linewidth=0, label="allocated, no token state")
        ax.plot(sub["time_s"], block, color=colors[name], linewidth=0.9, drawstyle="steps-post",
                label="block-level (allocated)")
        ax.plot(sub["time_s"], token, color="black", linewidth=0.7, drawstyle="steps-post",
                label="token-level (token states)")
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of pool")
        ax.set_title(name, fontsize=9, loc="left")
    # the legend's keys in neutral grey: each panel draws its band and line in its system's colour
    axes[0, 0].figure.legend(
        [F.plt.Rectangle((0, 0), 1, 1, color="#888", alpha=0.3, linewidth=0),
         F.plt.Line2D([], [], color="#888", linewidth=0.9),
         F.plt.Line2D([], [], color="black", linewidth=0.7)],
        ["allocated, no token state (band)", "block-level (allocated)",
         "token-level (token states)"], loc="outside right upper", fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("time (s)")
    fig.suptitle("Block-level vs token-level usage")
    return fig


def _serving_section(run: RunData, colors: dict[str, str]) -> list[str | PendingFigure]:
    systems, steps = run.systems, run.steps
    parts = ["<h2 id='serving'>Serving</h2>"]
    if not systems:
        return parts + [absent("Serving")]
    parts.append(PendingFigure(lambda: F.panel_bars(systems, [
        ("requests/s", lambda s: s["throughput"]["requests_per_s"]),
        ("output tokens/s", lambda s: s["throughput"]["output_tokens_per_s"]),
        ("mean batch (sequences)", lambda s: s["batch"]["mean_seqs"]),
    ], "Throughput and batch size", colors), "throughput per system",
        "Finished requests and their output tokens per second of simulated (or measured) "
        "time, and the mean number of sequences per step."))
    if steps:
        parts.append(PendingFigure(lambda: F.line_over_time(
            steps, "num_seqs", "running sequences", "Batch size over time", colors),
            "batch size over time", "Sequences computed in each step."))
    parts.append(PendingFigure(lambda: F.latency_percentiles(systems, colors),
                               "latency percentiles",
                               "Percentiles over finished requests; the table below lists them."))
    header, rows = latency_rows(systems)
    parts.append("<h3>Latency (seconds; normalized = end-to-end / output tokens, s/token)</h3>")
    parts.append(table(header, rows, digits=4, css_id="latency-table"))
    parts += serving_metrics_section(systems)
    finished = {n: f for n, f in run.requests.items() if (f["status"] == "finished").any()}
    if finished:
        parts.append(PendingFigure(
            lambda: F.latency_cdf(finished, colors), "normalized latency distribution",
            "Distribution of end-to-end latency / output tokens over finished requests (the "
            "metric of the PagedAttention paper's Fig. 12)."))
    parts.append("<h3>Preemptions, swaps and rejections</h3>")
    rows = [[n, s["preemptions"], s.get("swaps", 0), s["requests"]["rejected"],
             s["requests"].get("unfinished", 0),
             ", ".join(f"{k}: {v}" for k, v in (s.get("rejected_reasons") or {}).items()) or "–"]
            for n, s in systems.items()]
    parts.append(table(["system", "preemptions", "swaps", "rejected", "unfinished",
                        "rejection reasons"], rows, text_columns=(0, 5), css_id="preemption-table"))
    parts += offload_table(systems)
    executor_table = _executor_table(systems)
    if executor_table:
        parts.append("<h3>Executor measurements (real model and KV tensors)</h3>" + executor_table)
    if steps and any(int(f["num_preempted"].sum()) for f in steps.values()):
        parts.append(PendingFigure(lambda: F.line_over_time(
            steps, "num_preempted", "preemptions so far (count)", "Preemptions over time", colors,
            cumulative=True), "preemptions over time",
            "Requests preempted so far (recompute or swap), counted at the step that evicts them."))
    return parts


def _executor_table(systems: dict[str, dict]) -> str | None:
    """The torch executor's own report per system: scalars, and the median of timing stats."""
    reports = {n: s["executor"] for n, s in systems.items() if isinstance(s.get("executor"), dict)}
    if not reports:
        return None
    fields: dict[str, None] = {}
    for report in reports.values():
        for key, value in report.items():
            if key == "nvml":
                continue
            if isinstance(value, dict):
                for stat in ("median", "p50", "mean"):
                    if stat in value:
                        fields[f"{key} ({stat})"] = None
                        break
            elif not isinstance(value, list):
                fields[key] = None

    def lookup(report: dict, field: str):
        if field.endswith(")") and " (" in field:
            key, stat = field[:-1].split(" (")
            value = report.get(key)
            return value.get(stat) if isinstance(value, dict) else None
        return report.get(field)

    rows = [[field, *[lookup(r, field) for r in reports.values()]] for field in fields]
    return table(["measurement", *reports], rows, text_columns=(0,), digits=3,
                 css_id="executor-table")


def _kernel_section(run: RunData) -> list[str | PendingFigure]:
    parts = ["<h2 id='kernels'>Kernels</h2>"]
    if run.kernel_results is None:
        return parts + [absent("Kernel benchmarks (no kernel_results.json)")]
    try:
        from pagebench.reports.kernel_figures import kernel_figures

        figs = kernel_figures(run.kernel_results)
    except ImportError:
        figs = []
        parts.append("<p class='note'>pagebench.reports.kernel_figures is not available; the kernel "
                     "results are listed below.</p>")
    except Exception:  # noqa: BLE001 - a broken figure must not lose the whole report
        print("warning: kernel figures failed:\n" + traceback.format_exc(), file=sys.stderr)
        figs = []
        parts.append("<p class='note'>The kernel figures could not be drawn (see the render "
                     "log); the kernel results are listed below.</p>")
    for i, (fig, caption) in enumerate(figs):
        parts.append(PendingFigure(lambda fig=fig: fig, f"kernel figure {i + 1}",
                                   caption + " The table below has the numbers."))
    summary = run.kernel_results.get("summary")
    if isinstance(summary, dict) and summary and all(isinstance(v, dict) for v in summary.values()):
        rows = []
        for head, stats in summary.items():
            ratio = stats.get("paged_over_contiguous") or {}
            share = stats.get("indirection_share") or {}
            rows.append([head, stats.get("points"), ratio.get("min"), ratio.get("median"),
                         ratio.get("max"), None if share.get("median") is None
                         else 100.0 * share["median"], None if share.get("max") is None
                         else 100.0 * share["max"], stats.get("errors")])
        parts.append(table(["head config", "points", "paged/contiguous min", "median", "max",
                            "indirection share of decode step, median (%)", "max (%)", "errors"],
                           rows, digits=3, css_id="kernel-summary-table"))
    scalars = [[k, v] for k, v in run.kernel_results.items()
               if isinstance(v, (int, float, str, bool)) and k not in ("schema_version", "schema")]
    if scalars:
        parts.append(table(["field", "value"], scalars, text_columns=(0, 1), digits=4,
                           css_id="kernel-table"))
    return parts


def _kernel_summary(kernel: dict) -> str:
    """The summary of a kernels-only run: what was timed, and paged / contiguous per head."""
    from pagebench.reports.summary import kernel_summary_lines

    lines = kernel_summary_lines(kernel)
    items = "".join(f"<li>{esc(line.strip())}</li>" for line in lines[1:])
    what = ("on a CPU, torch's reference paths (not the Triton kernels)"
            if kernel.get("timings") == "cpu" else "the Triton decode kernels on a GPU")
    return (f"<p id='kernel-summary'>A kernels-only run (no serving run): it timed decode "
            f"attention through the block table and without it, {esc(what)}.</p>"
            + (f"<ul>{items}</ul>" if items else ""))


def _telemetry_section(run: RunData, colors: dict[str, str]) -> list[str | PendingFigure]:
    parts = ["<h2 id='telemetry'>GPU telemetry</h2>"]
    energy = {n: energy_per_token_j(s) for n, s in run.systems.items()}
    energy = {n: v for n, v in energy.items() if v is not None}
    notes = [s.get("nvml", {}).get("note") for s in run.systems.values()
             if isinstance(s.get("nvml"), dict) and s["nvml"].get("note")]
    if isinstance((run.results or {}).get("nvml"), dict) and run.results["nvml"].get("note"):
        notes.append(run.results["nvml"]["note"])
    if run.nvml is None and not energy:
        parts.append(absent("NVML telemetry (no GPU or no samples file)"))
    if run.nvml is not None:
        fig = telemetry_figure(run.nvml, colors)
        if fig is not None:
            parts.append(PendingFigure(lambda: fig, "GPU telemetry over time",
                                       f"{len(run.nvml):,} samples from {run.nvml_path.name}"))
        else:
            parts.append(f"<p class='note'>{esc(run.nvml_path.name)} has no time column or no "
                         "numeric samples.</p>")
    if energy:
        parts.append(table(["system", "energy per output token (J)"],
                           [[n, v] for n, v in energy.items()], digits=4, css_id="energy-table"))
    for note in dict.fromkeys(notes):
        parts.append(f"<p class='note'>{esc(note)}</p>")
    return parts


def _claims_section(run: RunData) -> list[str]:
    parts = ["<h2 id='claims'>Theory and claims</h2>",
             "<p>The reference article's claims (from <code>reports/claims.yaml</code>) next to "
             "what this run measured. Worked examples are computed by this harness's own "
             "allocators; the rest come from this run.</p>"]
    rows = evaluate_claims(run)
    header = ["claim", "article", "measured on", "measured", "expected", "unit", "verdict",
              "how measured"]
    body = []
    for i, row in enumerate(rows):
        cls = {HOLDS: "holds", FAILS: "fails"}.get(row.verdict, "unmeasured")
        cells = ""
        if i == 0 or rows[i - 1].claim_id != row.claim_id:
            span = sum(1 for r in rows if r.claim_id == row.claim_id)
            note = (f"<br><small class='absent'>{esc(row.conditions)}</small>"
                    if row.conditions else "")
            cells += (f"<td class='text' rowspan='{span}'>{esc(row.claim)}{note}</td>"
                      f"<td class='text' rowspan='{span}'>{esc(row.article_value)}</td>")
        cells += (f"<td class='text'>{esc(row.subject)}</td><td>{fmt(row.measured)}</td>"
                  f"<td class='text'>{esc(row.expected)}</td><td class='text'>{esc(row.unit)}</td>"
                  f"<td class='text {cls}'>{esc(row.verdict)}</td>"
                  f"<td class='text'>{esc(row.how)}</td>")
        body.append(f"<tr data-claim='{esc(row.claim_id)}'>{cells}</tr>")
    head = "".join(f"<th class='text'>{esc(h)}</th>" for h in header)
    parts.append(f"<table id='claims-table'><thead><tr>{head}</tr></thead><tbody>"
                 + "".join(body) + "</tbody></table>")
    return parts


def _workload_section(run: RunData) -> list[str]:
    parts = ["<h2 id='workload'>Workload and run</h2>"]
    workload = (run.results or {}).get("workload") or {}
    rows = []
    for key, value in workload.items():
        if isinstance(value, dict) and all(not isinstance(v, (dict, list)) for v in value.values()):
            value = Raw(", ".join(f"{esc(k)}={fmt(v)}" for k, v in value.items()))  # escaped once
        elif isinstance(value, (dict, list)):
            continue
        rows.append([key, value])
    if rows:
        parts.append(table(["workload field", "value"], rows, text_columns=(0, 1),
                           css_id="workload-table"))
    elif not run.results:
        return []  # a kernels-only run: its run details are in the Kernels section
    info = run.run_info
    info_rows = [[k, v] for k, v in info.items() if not isinstance(v, (dict, list))]
    for name, sys_info in (info.get("systems") or {}).items():
        info_rows.append([f"{name}: wall time (s)", sys_info.get("wall_time_s")])
        info_rows.append([f"{name}: engine steps per wall second", sys_info.get("steps_per_s")])
    if info_rows:
        parts.append(table(["run", "value"], info_rows, text_columns=(0, 1), css_id="run-table"))
    return parts


def render_run_report(run_dir: Path) -> Path:
    """Write ``run_dir/report.html`` from the result files found there; returns its path."""
    run = load_run(run_dir)
    systems = run.systems
    colors = F.system_colors(list(systems))
    parts = _header(run)
    parts += load_parts(run.results or {})
    parts.append("<h2 id='summary'>Summary</h2>")
    if systems:
        sentence = headline_sentence(systems)
        if sentence:
            parts.append(f"<p id='headline'>{sentence}</p>")
        header, rows = summary_rows(systems)
        parts.append(table(header, rows, text_columns=(0, 1), css_id="summary-table"))
        parts += _memory_section(run, colors)
        parts += _serving_section(run, colors)
    else:  # a kernels-only run: what it measured first, then its figures
        parts.append(_kernel_summary(run.kernel_results or {}))
    parts += _kernel_section(run)
    parts += _telemetry_section(run, colors)
    parts += _claims_section(run)
    parts += _workload_section(run)
    present = [(sid, label) for sid, label in SECTIONS
               if any(isinstance(p, str) and p.startswith(f"<h2 id='{sid}'>") for p in parts)]
    parts[parts.index(NAV)] = ("<nav>" + "".join(f"<a href='#{sid}'>{esc(label)}</a>"
                                                 for sid, label in present) + "</nav>")
    out = Path(run_dir) / "report.html"
    atomic_write_text(out, page("pagebench report", resolve(parts)))
    return out
