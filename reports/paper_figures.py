"""The PagedAttention paper's figures, redrawn from a study's measured values.

Each ``FIGURES[study]`` drawer takes ``study.json``'s content and the study's entry of
``reports/paper_values.yaml`` and returns a matplotlib figure drawn like the paper's:
published values hatched beside the measured ones where the paper prints them.
``pagebench.reports.paper_section`` places the figure in the study's report.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pagebench.reports import figures as F

PAPER_LABELS = {"orca_max": "Orca (Max)", "orca_pow2": "Orca (Pow2)",
                "orca_oracle": "Orca (Oracle)", "vllm": "vLLM"}
# The paper's own legend colours are not reproduced; the harness's system colours are.
PAPER_CATEGORIES = [("token_states", "token states", "#2e7d32"),
                    ("reservation", "reservation", "#9ccc65"),
                    ("internal_fragmentation", "internal fragmentation", "#ef6c00"),
                    ("external_and_others", "external fragmentation & others", "#c62828")]
PUBLISHED_HATCH = "//"


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
