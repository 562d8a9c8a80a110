"""The PagedAttention-paper section of a study's report: figure, measured vs published, causes.

``render_study_report(run_dir)`` reads ``study.json`` (written by ``harness.studies``)
and ``reports/paper_values.yaml`` (the published values) and writes ``report.html``:
the measured figure drawn like the paper's (published values beside the measured
ones where the paper prints them), a table of published vs measured values with the
difference, and a sentence for each material difference.

    python -m reports.paper_section <study run dir> [...]              # re-render
    python -m reports.paper_section --markdown <study run dirs>        # docs/paper.md table
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from harness.fileio import atomic_write_text
from reports import figures as F
from reports.html import esc, figure, fmt, page, table

PAPER_VALUES = Path(__file__).with_name("paper_values.yaml")
PAPER_LABELS = {"orca_max": "Orca (Max)", "orca_pow2": "Orca (Pow2)",
                "orca_oracle": "Orca (Oracle)", "vllm": "vLLM"}
# The paper's own legend colours are not reproduced; the harness's system colours are.
PAPER_CATEGORIES = [("token_states", "token states", "#2e7d32"),
                    ("reservation", "reservation", "#9ccc65"),
                    ("internal_fragmentation", "internal fragmentation", "#ef6c00"),
                    ("external_and_others", "external fragmentation & others", "#c62828")]
PUBLISHED_HATCH = "//"


def load_paper_values(path: Path = PAPER_VALUES) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


# ------------------------------------------------------------------ comparison rows

def compare(entry: dict, measured: Any, material: dict) -> dict:
    """Published vs measured for one value: the difference and whether it is material."""
    published, how = entry["published"], entry.get("how", "label")
    out = {"published": published, "measured": measured, "diff": None, "rel": None,
           "material": None}
    if measured is None:
        return out
    if how == "set":
        same = set(published) == set(measured)
        out["diff"] = "same set" if same else (
            f"missing {sorted(set(published) - set(measured))}, extra {sorted(set(measured) - set(published))}")
        out["material"] = not same
        return out
    if how == "range":
        lo, hi = published
        diff = 0.0 if lo <= measured <= hi else (measured - hi if measured > hi else measured - lo)
        ref = hi if measured > hi else lo
    else:
        diff, ref = measured - float(published), float(published)
    out["diff"] = diff
    out["rel"] = diff / ref if ref else None
    limit = max(float(material.get("abs", 0.0)), float(material.get("rel", 0.0)) * abs(ref))
    out["material"] = abs(diff) > limit + 1e-12
    return out


def cause_for(ident: str, causes: dict) -> str | None:
    """The cause sentence for ``ident``: an exact key, else the longest matching id prefix."""
    if ident in causes:
        return causes[ident]
    best = None
    for key in causes:
        if ident.startswith(key + ".") or ident.startswith(key + "/"):
            if best is None or len(key) > len(best):
                best = key
    return causes[best] if best else None


def comparison_rows(study: dict, spec: dict) -> list[dict]:
    measured = study.get("measured", {})
    rows = []
    for entry in spec.get("values", []):
        row = compare(entry, measured.get(entry["id"]), spec.get("material", {}))
        row.update(id=entry["id"], system=entry.get("system"), quantity=entry["quantity"],
                   how=entry.get("how", "label"), quote=entry.get("quote"))
        rows.append(row)
    return rows


def _show(value: Any, digits: int = 2) -> str:
    if isinstance(value, list):
        if len(value) == 2 and all(isinstance(v, (int, float)) for v in value) and \
                not all(isinstance(v, int) for v in value):
            return f"{value[0]:g}–{value[1]:g}"
        return ", ".join(str(v) for v in value) if value else "none"
    if isinstance(value, float):
        return fmt(value, digits)
    return fmt(value) if value is not None else "–"


def comparison_table(rows: list[dict], unit: str) -> str:
    header = ["system", "quantity", f"published ({unit})", "how read", f"measured ({unit})",
              "difference", "material"]
    body = []
    for r in rows:
        diff = r["diff"]
        if isinstance(diff, float):
            rel = f" ({100 * r['rel']:+.0f}%)" if r["rel"] is not None and r["how"] != "range" else ""
            diff_text = f"{diff:+.2f}{rel}" if r["how"] != "range" or diff else "inside range"
        else:
            diff_text = diff if diff is not None else "–"
        verdict = {True: "yes", False: "no", None: "not measured"}[r["material"]]
        body.append([PAPER_LABELS.get(r["system"], r["system"] or ""), r["quantity"],
                     _show(r["published"]), r["how"], _show(r["measured"]), diff_text, verdict])
    return table(header, body, text_columns=(0, 1, 3, 5, 6))


# ---------------------------------------------------------------------------- figures

def _labels(study: dict) -> dict[str, str]:
    return {name: PAPER_LABELS[name] for name in PAPER_LABELS
            if name in (study.get("params", {}).get("systems") or {})}


def _colors(study: dict) -> dict[str, str]:
    systems = study.get("params", {}).get("systems") or {}
    catalog = F.system_colors(list(systems.values()))
    return {paper: catalog[name] for paper, name in systems.items()}


def _values(spec: dict) -> dict[str, Any]:
    return {v["id"]: v["published"] for v in spec.get("values", [])}


def fig2_figure(study: dict, spec: dict):
    import matplotlib.pyplot as plt

    measured, published = study["measured"], _values(spec)
    names = list(_labels(study))
    fig, ax = plt.subplots(figsize=(2.0 + 1.7 * len(names), 4.4))
    x = np.arange(len(names))
    width = 0.38
    for offset, source, hatch in ((-width / 2, published, PUBLISHED_HATCH), (width / 2, measured, None)):
        bottom = np.zeros(len(names))
        for key, label, color in PAPER_CATEGORIES:
            vals = []
            for n in names:
                v = source.get(f"{n}.{key}")
                if v is None and source is published and n == "vllm" and key == "external_and_others":
                    v = source.get("vllm.waste")  # the paper shows vLLM's rest as one bar
                vals.append(v or 0.0)
            vals = np.array(vals, dtype=float)
            ax.bar(x + offset, vals, width, bottom=bottom, color=color, hatch=hatch,
                   edgecolor="white" if hatch is None else "#333", linewidth=0.4,
                   label=label if source is measured else None, alpha=0.55 if hatch else 1.0)
            for xi, b, v in zip(x + offset, bottom, vals):
                if v >= 4.0:
                    ax.text(xi, b + v / 2, f"{v:.1f}", ha="center", va="center", fontsize=7)
            bottom += vals
    ax.set_xticks(x, [f"{PAPER_LABELS[n]}\npublished | measured" for n in names], fontsize=8)
    ax.set_ylabel("KV cache usage (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Fig. 2: KV memory by use (hatched: published; solid: measured)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return fig


def _bars_with_published(ax, names, measured_vals, published_vals, colors, extra=None,
                         extra_label=None, fmt_str="{:.2f}"):
    x = np.arange(len(names))
    groups = [("published", published_vals, PUBLISHED_HATCH, 0.5)]
    groups.append(("measured", measured_vals, None, 1.0))
    if extra is not None:
        groups.append((extra_label, extra, "..", 0.8))
    width = 0.8 / len(groups)
    for i, (label, vals, hatch, alpha) in enumerate(groups):
        pos = x + (i - (len(groups) - 1) / 2) * width
        heights = [np.nan if v is None else v for v in vals]
        ax.bar(pos, heights, width, color=[colors[n] for n in names], hatch=hatch, alpha=alpha,
               edgecolor="#333" if hatch else "white", linewidth=0.4)
        for p, v in zip(pos, vals):
            if v is not None and math.isfinite(v):
                ax.text(p, v, fmt_str.format(v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [PAPER_LABELS.get(n, n) for n in names], fontsize=8)


def _legend_sources(fig, extra_label=None):
    import matplotlib.patches as mpatches

    handles = [mpatches.Patch(facecolor="#bbb", hatch=PUBLISHED_HATCH, edgecolor="#333", label="published"),
               mpatches.Patch(facecolor="#888", label="measured")]
    if extra_label:
        handles.append(mpatches.Patch(facecolor="#ccc", hatch="..", edgecolor="#333", label=extra_label))
    fig.legend(handles=handles, loc="upper right", fontsize=8, frameon=False, ncol=len(handles))


def fig13_figure(study: dict, spec: dict):
    import matplotlib.pyplot as plt

    measured, published = study["measured"], _values(spec)
    names, colors = list(_labels(study)), _colors(study)
    rates = study["params"].get("rates", {})
    panels = list(rates)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.9), squeeze=False)
    has_sat = any(k.split(".")[1:2] == ["saturated"] for k in measured)
    for ax, panel in zip(axes[0], panels):
        _bars_with_published(
            ax, names, [measured.get(f"{panel}.{n}") for n in names],
            [published.get(f"{panel}.{n}") for n in names], colors,
            extra=[measured.get(f"{panel}.saturated.{n}") for n in names] if has_sat else None,
            extra_label="measured, saturated" if has_sat else None)
        ax.set_ylabel("# batched requests")
        ax.set_title(f"{'ShareGPT' if panel == 'sharegpt' else 'Alpaca'}-like, {rates[panel]:g} req/s")
    _legend_sources(fig, "measured, saturated (supplement)" if has_sat else None)
    fig.suptitle("Fig. 13: average number of batched requests", x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return fig


def _rate_figure(study: dict, title: str, panel_titles: dict[str, str]):
    import matplotlib.pyplot as plt

    colors, labels = _colors(study), _labels(study)
    series, sustained = study.get("series", {}), study.get("sustained", {})
    threshold = study.get("threshold_s_per_token")
    panels = list(series)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        top = 1.0
        for name in labels:
            pts = [(r, lat) for r, lat in series[panel].get(name, []) if lat is not None]
            if not pts:
                continue
            r, lat = zip(*pts)
            ax.plot(r, lat, marker="o", markersize=3.5, color=colors[name], label=labels[name])
            s = (sustained.get(panel) or {}).get(name) or {}
            if s.get("rate"):
                ax.axvline(s["rate"], color=colors[name], linestyle=":", linewidth=0.9)
        if threshold:
            ax.axhline(threshold, color="#555", linestyle="--", linewidth=0.8,
                       label=f"threshold {threshold:g} s/token")
        ax.set_ylim(0, top)
        ax.set_xlim(left=0)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("normalized latency (s/token)")
        ax.set_title(panel_titles.get(panel, panel))
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle(title + " (dotted: sustained rate)", x=0.02, ha="left")
    fig.tight_layout()
    return fig


def fig12_figure(study: dict, spec: dict):
    return _rate_figure(study, "Fig. 12: normalized latency vs request rate, OPT-13B",
                        {"sharegpt": "(a) ShareGPT-like", "alpaca": "(d) Alpaca-like"})


def shared_prefix_figure(study: dict, spec: dict):
    return _rate_figure(study, "Fig. 16: shared prefix, LLaMA-13B",
                        {"one_shot": "(a) 1-shot prefix (80 tokens)",
                         "five_shot": "(b) 5-shot prefix (341 tokens)"})


def fig15_figure(study: dict, spec: dict):
    import matplotlib.pyplot as plt

    measured, published = study["measured"], _values(spec)
    widths = study["params"]["widths"]
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.8))
    for ax, panel, xlabel in ((axes[0], "parallel", "# output sequences"),
                              (axes[1], "beam", "beam width")):
        ws = widths[panel]
        x = np.arange(len(ws))
        for offset, source, hatch, alpha in ((-0.2, published, PUBLISHED_HATCH, 0.5),
                                             (0.2, measured, None, 1.0)):
            vals = [source.get(f"{panel}.{w}") for w in ws]
            ax.bar(x + offset, [np.nan if v is None else v for v in vals], 0.4,
                   color="#1f77b4", hatch=hatch, alpha=alpha, edgecolor="#333" if hatch else "white",
                   linewidth=0.4)
            for xi, v in zip(x + offset, vals):
                if v is not None:
                    ax.text(xi, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [str(w) for w in ws])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("memory saving (%)")
        ax.set_title("(a) Parallel sampling" if panel == "parallel" else "(b) Beam search")
    _legend_sources(fig)
    fig.suptitle("Fig. 15: memory saved by sharing (1 - physical / logical blocks)", x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return fig


def fig18b_figure(study: dict, spec: dict):
    import matplotlib.pyplot as plt

    series = study.get("series", {})
    rates = study["params"]["rates"]
    published = _values(spec)
    variants = [("", "at the fixed rate"), (".saturated", "saturated (supplement)")]
    variants = [(suffix, text) for suffix, text in variants
                if any(k.endswith(suffix) or suffix == "" for k in series)
                and any(f"{p}{suffix}" in series for p in rates)]
    fig, axes = plt.subplots(len(variants), len(rates), figsize=(5.2 * len(rates), 3.3 * len(variants)),
                             squeeze=False)
    for row, (suffix, text) in enumerate(variants):
        for col, (panel, rate) in enumerate(rates.items()):
            ax = axes[row, col]
            pts = series.get(f"{panel}{suffix}", [])
            sizes = [str(bs) for bs, _ in pts]
            lats = [np.nan if lat is None else lat for _, lat in pts]
            best = set(published.get(f"{panel}.best_block_sizes") or [])
            ax.bar(sizes, lats, color=["#1f77b4" if int(s) in best else "#9ecae1" for s in sizes])
            ax.set_xlabel("block size (tokens)")
            ax.set_ylabel("normalized latency (s/token)")
            name = "ShareGPT" if panel == "sharegpt" else "Alpaca"
            ax.set_title(f"{name}-like, {text}" + (f" ({rate:g} req/s)" if not suffix else ", t=0"),
                         fontsize=9)
            if lats and np.isfinite(np.nanmin(lats)):
                lo, hi = np.nanmin(lats), np.nanmax(lats)
                ax.set_ylim(max(0.0, lo - 0.15 * (hi - lo + 1e-9) - 0.002), hi + 0.1 * (hi - lo) + 0.002)
    fig.suptitle("Fig. 18b: normalized latency vs block size (dark: the paper's best sizes)",
                 x=0.02, ha="left")
    fig.tight_layout()
    return fig


FIGURES = {"vllm_fig2": fig2_figure, "vllm_fig13": fig13_figure, "vllm_fig12": fig12_figure,
           "vllm_fig15": fig15_figure, "vllm_fig18b": fig18b_figure,
           "shared_prefix": shared_prefix_figure}


# ------------------------------------------------------------------------- details

def details_table(study: dict) -> str | None:
    """Study-specific measured details (sustained rates, waiting shares, token-level savings...)."""
    name = study["study"]
    if name in ("vllm_fig12", "shared_prefix"):
        rows = []
        for panel, systems in (study.get("sustained") or {}).items():
            for system, s in systems.items():
                bracket = (f"{s['lo']:g}–{s['hi']:g}" if s.get("lo") is not None and s.get("hi") is not None
                           else "not reached" if not s.get("bounded") else "below the grid")
                rows.append([panel, PAPER_LABELS.get(system, system), s.get("rate"), bracket])
        return table(["panel", "system", "sustained rate (req/s)", "between grid rates"], rows,
                     text_columns=(0, 1, 3))
    details = study.get("details")
    if not details:
        return None
    keys = sorted({k for d in details.values() for k in d})
    rows = [[ident] + [d.get(k) for k in keys] for ident, d in details.items()]
    return table(["run"] + keys, rows, text_columns=(0,))


def causes_list(rows: list[dict], spec: dict, scale: float = 1.0) -> str:
    causes = spec.get("causes") or {}
    items = []
    for r in rows:
        if not r["material"]:
            continue
        text = cause_for(r["id"], causes)
        label = f"{PAPER_LABELS.get(r['system'], r['system'])}, {r['quantity']}"
        items.append(f"<li><b>{esc(label)}</b>: "
                     + (esc(text) if text else "<i>no cause recorded in reports/paper_values.yaml</i>")
                     + "</li>")
    general = spec.get("notes")
    parts = []
    if items:
        parts.append("<h4>Material differences and their likely causes</h4><ul>" + "".join(items) + "</ul>")
        if scale != 1.0:  # the sentences quote figures of the full-size study
            parts.append(f"<p class='note'>This run is scaled (study.scale={scale:g}); the causes "
                         "were written for the full-size study, so the figures they quote may "
                         "differ from the table above.</p>")
    else:
        parts.append("<p>No material difference from the published values.</p>")
    if general:
        parts.append(f"<p class='note'>{esc(general)}</p>")
    return "\n".join(parts)


def _setup_text(study: dict) -> str:
    """The study's setup and timing lines. Every value is escaped (``fmt`` escapes text): a
    received study.json may hold anything in any field."""
    setup, params = study.get("setup", {}), study.get("params", {})
    engine = setup.get("engine", {})
    model, hw = setup.get("model", {}), setup.get("hardware", {})
    bits = [f"model <b>{esc(model.get('name'))}</b>", f"hardware <b>{esc(hw.get('name'))}</b>",
            f"KV capacity <b>{fmt(engine.get('kv_capacity_slots'))}</b> slots",
            f"max length {fmt(engine.get('max_model_len'))}",
            f"max_num_seqs {fmt(engine.get('max_num_seqs'))}, max_num_batched_tokens "
            f"{fmt(engine.get('max_num_batched_tokens'))}",
            f"preemption {fmt(engine.get('preemption'))}",
            f"block size {fmt(setup.get('block_size'))} (vLLM)",
            f"executor {fmt(engine.get('executor'))}", f"seed {esc(setup.get('seed'))}"]
    shown = {k: v for k, v in params.items()
             if k not in ("name", "figure", "workers", "systems", "min_requests")}
    timing = study.get("timing", {})
    jobs = study.get("jobs")
    return ("<p class='meta'>" + "; ".join(bits) + "</p>"
            + f"<p class='meta'>Study parameters: <code>{esc(json.dumps(shown))}</code></p>"
            + f"<p class='meta'>{fmt(len(jobs) if isinstance(jobs, list) else 0)} runs; wall "
              f"{fmt(timing.get('wall_time_s'))} s on {fmt(timing.get('workers'))} worker(s) "
              f"({fmt(timing.get('jobs_cpu_time_s'))} CPU-s in the runs; load average "
              f"{fmt(timing.get('load_average_1m'))}); "
              f"{'complete' if study.get('complete') else 'INCOMPLETE'}.</p>")


def study_section(study: dict, values: dict | None = None, *, heading_level: int = 2) -> str:
    """One experiment's section: figure, published-vs-measured table, causes, details."""
    values = values or load_paper_values()
    name = study["study"]
    spec = (values.get("experiments") or {}).get(name, {})
    h = f"h{heading_level}"
    parts = [f"<{h} id='{esc(name)}'>{esc(spec.get('figure', ''))}: {esc(spec.get('title', name))}</{h}>",
             f"<p class='meta'>Paper caption: <i>{esc(spec.get('paper_caption', ''))}</i></p>",
             _setup_text(study)]
    drawer = FIGURES.get(name)
    if drawer is not None:
        try:
            parts.append(figure(F.to_data_uri(drawer(study, spec)), f"{name} figure",
                                "The paper's figure redrawn from this study's measurements; "
                                "the table below sets them beside the published values."))
        except Exception as exc:  # a figure must not lose the tables
            parts.append(f"<p class='absent'>figure failed: {esc(type(exc).__name__)}: {esc(exc)}</p>")
    rows = comparison_rows(study, spec)
    if rows:
        parts.append("<h4>Published vs measured</h4>")
        parts.append(comparison_table(rows, spec.get("unit", "")))
        quotes = [r for r in rows if r.get("quote")]
        if quotes:
            parts.append("<ul class='meta'>" + "".join(f"<li>{esc(r['quote'])}</li>" for r in quotes)
                         + "</ul>")
        material = spec.get("material")
        if material:
            parts.append(f"<p class='meta'>A difference is material above max({material.get('abs', 0):g}, "
                         f"{100 * material.get('rel', 0):g}% of the published value).</p>")
        parts.append(causes_list(rows, spec, float(study.get("params", {}).get("scale", 1.0))))
    details = details_table(study)
    if details:
        parts.append("<h4>Measured details</h4>" + details)
    if name == "vllm_fig18b":  # the memory and the time effect of the block size, apart
        from reports.block_size_effects import study_effects

        parts.append(study_effects(study))
    return "\n".join(parts)


_STUDY_MAPPINGS = ("params", "setup", "timing", "host", "measured", "workloads", "series", "sustained",
                   "details")


def read_study(path: Path) -> dict:
    """Load a study.json (``path``: the file or its run directory), checking that it is one
    this version can render; a malformed file is an InputError naming the file and field."""
    from harness.errors import InputError
    from harness.fileio import read_json
    from harness.results import STUDY_SCHEMA_VERSION

    path = Path(path)
    if path.is_dir() and path.name != "study.json":
        path = path / "study.json"
    study = read_json(path, "study file not found; pass a study run directory or its study.json")
    if not isinstance(study, dict):
        raise InputError(f"not a pagebench study file (expected a JSON object, got "
                         f"{type(study).__name__})", path=str(path))
    if study.get("kind", "study") != "study":
        raise InputError(f"not a pagebench study file (kind {study['kind']!r}, expected 'study')",
                         path=str(path), field="kind")
    version = study.get("schema_version", STUDY_SCHEMA_VERSION)
    if version != STUDY_SCHEMA_VERSION:
        raise InputError(f"{version!r} is not supported (this pagebench reads "
                         f"{STUDY_SCHEMA_VERSION}); re-run the study with the matching version",
                         path=str(path), field="schema_version")
    if not isinstance(study.get("study"), str) or not study["study"]:
        problem = "missing" if "study" not in study else f"must be the study's name, got {study['study']!r}"
        raise InputError(f"{problem} (the name of the study, e.g. 'vllm_fig2')", path=str(path), field="study")
    for key in _STUDY_MAPPINGS:
        if study.get(key) is not None and not isinstance(study[key], dict):
            raise InputError(f"must be a mapping, got {type(study[key]).__name__}", path=str(path), field=key)
    if study.get("jobs") is not None and not isinstance(study["jobs"], list):
        raise InputError(f"must be a list, got {type(study['jobs']).__name__}", path=str(path), field="jobs")
    for ident, value in (study.get("measured") or {}).items():
        if not (value is None or _is_number(value)
                or (isinstance(value, list) and all(_is_number(v) for v in value))):
            raise InputError(f"must be a number, a list of numbers or null, got {value!r:.60}",
                             path=str(path), field=f"measured.{ident}")
    return study


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def render_study_report(run_dir: Path) -> Path:
    """Write ``report.html`` for the study in ``run_dir`` (reads ``study.json``)."""
    run_dir = Path(run_dir)
    study = read_study(run_dir / "study.json")
    values = load_paper_values()
    body = [f"<h1>pagebench: reproducing the PagedAttention paper — {esc(study['study'])}</h1>",
            f"<p class='meta'>{esc(values.get('source', ''))}</p>",
            f"<p class='meta'>pagebench {esc(study.get('pagebench_version'))}, {esc(study.get('created'))}, "
            f"host {esc((study.get('host') or {}).get('node'))}; simulated timings (sim executor), "
            "not GPU measurements.</p>",
            study_section(study, values)]
    out = run_dir / "report.html"
    atomic_write_text(out, page(f"pagebench {study['study']}", body))
    return out


def markdown_summary(studies: list[dict], values: dict | None = None) -> str:
    """One Markdown table of published vs measured values over several studies (docs/paper.md)."""
    values = values or load_paper_values()
    lines = ["| figure | system | quantity | published | measured | difference |",
             "|---|---|---|---|---|---|"]
    for study in studies:
        spec = (values.get("experiments") or {}).get(study["study"], {})
        for r in comparison_rows(study, spec):
            diff = r["diff"]
            if isinstance(diff, float):
                diff = "inside range" if r["how"] == "range" and not diff else f"{diff:+.2f}"
            mark = " *" if r["material"] else ""
            lines.append(f"| {spec.get('figure', study['study'])} | "
                         f"{PAPER_LABELS.get(r['system'], r['system'])} | {r['quantity']} | "
                         f"{_show(r['published'])} | {_show(r['measured'])} | {diff}{mark} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    markdown = "--markdown" in args
    dirs = [a for a in args if a != "--markdown"]
    if not dirs:
        print("usage: python -m reports.paper_section [--markdown] <study run dir> [...]",
              file=sys.stderr)
        return 2
    from harness.errors import PagebenchError

    try:
        if markdown:  # the measured-vs-published table of docs/paper.md, from finished studies
            studies = [read_study(Path(d)) for d in dirs]
            print(markdown_summary(studies), end="")
            return 0
        for arg in dirs:
            print(render_study_report(Path(arg)))
    except PagebenchError as exc:  # a malformed study.json
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
