"""The validation report (``python -m harness.tools.validate``'s validate.json): per system,
sim against measured figures with their errors, the steps by phase and bucket, and a
predicted-vs-measured scatter of step durations. Also its markdown and console tables."""

from __future__ import annotations

from pathlib import Path

from pagebench.reports.html import esc, figure, page, table

FIGURES = (("requests_per_s", "req/s"), ("output_tokens_per_s", "output tok/s"),
           ("mean_batch", "mean batch"), ("ttft_p50_s", "TTFT p50 (s)"),
           ("ttft_p99_s", "TTFT p99 (s)"), ("tpot_p50_s", "TPOT p50 (s)"),
           ("decode_step_mean_s", "mean decode step (s)"),
           ("prefill_step_mean_s", "mean prefill step (s)"),
           ("requests_per_s_without_slow_steps", "req/s, measured less its slow steps' excess"))
HEADER = ["system", "figure", "measured", "sim", "sim/measured", "error %", "target"]


def figure_rows(report: dict) -> list[list]:
    """One row per (system, figure): measured, sim, ratio, error, whether within target."""
    rows = []
    for name, s in report["systems"].items():
        label = name if s.get("measured_complete", True) else f"{name} (measured run incomplete)"
        for key, text in FIGURES:
            if key not in s["figures"]:
                continue
            f = s["figures"][key]
            m, p = f.get("measured"), f.get("predicted")
            ratio = round(p / m, 3) if m and p is not None else None
            target = ("–" if f.get("target_pct") is None else
                      f"±{f['target_pct']:g}% " + ("met" if f.get("within_target") else "missed"))
            rows.append([label, text, m, p, ratio, f.get("error_pct"), target])
    return rows


def bucket_rows(report: dict) -> list[list]:
    rows = []
    for name, s in report["systems"].items():
        for b in s["steps"]["buckets"]:
            rows.append([name, b["phase"], b["batch_bucket"], b["context_bucket"], b["steps"],
                         b["measured_mean_s"] * 1e3, b["predicted_mean_s"] * 1e3, b["error_pct"]])
    return rows


BUCKET_HEADER = ["system", "phase", "batch >=", "context >= (decode: KV/seq; prefill: tokens)",
                 "steps", "measured ms", "sim ms", "error %"]


def _md_table(header: list[str], rows: list[list]) -> str:
    def cell(v):
        if v is None:
            return "–"
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _profiles_line(report: dict) -> str:
    p = report["profiles"]
    return (f"hardware={report['hardware']} kernel_profile={p.get('kernel_profile')} "
            f"host_profile={p.get('host_profile')} cost model={p.get('cost_model')}"
            + (f" kernel_results={p['kernel_results']}" if p.get("kernel_results") else ""))


def markdown(report: dict) -> str:
    """validate.md: the figures table, the steps by phase and the buckets."""
    phase_rows = [[name, ph, v["steps"], v["measured_s"], v["predicted_s"], v["error_pct"],
                   "paired" if s["steps"]["paired"] else "unpaired"]
                  for name, s in report["systems"].items() for ph, v in s["steps"]["by_phase"].items()]
    return "\n\n".join([
        f"# Validation: {report['workload']} ({report['model']}), sim against {report['run_dir']}",
        _profiles_line(report) + f"; capacity {report['capacity_slots']} slots",
        _md_table(HEADER, figure_rows(report)),
        "## Step time by phase (sum over steps)",
        _md_table(["system", "phase", "steps", "measured s", "sim s", "error %", "steps"], phase_rows),
        "## Steps by bucket", _md_table(BUCKET_HEADER, bucket_rows(report))]) + "\n"


def console_table(report: dict) -> str:
    """The headline figures, one line per system."""
    keys = ("requests_per_s", "output_tokens_per_s", "mean_batch", "ttft_p50_s", "ttft_p99_s",
            "tpot_p50_s", "decode_step_mean_s")
    labels = ("req/s", "out tok/s", "mean batch", "TTFT p50", "TTFT p99", "TPOT p50", "decode step")
    head = f"{'system':<10}" + "".join(f"{label:>13}" for label in labels)
    lines = [_profiles_line(report), "error % (sim vs measured; * = outside the target)", head]
    for name, s in report["systems"].items():
        cells = []
        for k in keys:
            f = s["figures"][k]
            mark = "*" if f.get("within_target") is False else ""
            cells.append("–" if f["error_pct"] is None else f"{f['error_pct']:+.1f}{mark}")
        note = "" if s.get("measured_complete", True) else "  (measured run incomplete)"
        if s.get("measured_slow_steps"):
            note += (f"  ({len(s['measured_slow_steps'])} measured steps >2x their shape's, "
                     f"{s['slow_steps_excess_s']:.2f} s excess")
            extra = s["figures"].get("requests_per_s_without_slow_steps")
            note += f"; req/s {extra['error_pct']:+.1f}% without it)" if extra else ")"
        lines.append(f"{name:<10}" + "".join(f"{c:>13}" for c in cells) + note)
    return "\n".join(lines)


def scatter_uri(report: dict) -> str | None:
    """Predicted against measured step durations (log axes, y = x dashed), a colour per system."""
    from pagebench.reports.figures import subplots, system_colors, to_data_uri

    systems = {n: s["steps"]["points"] for n, s in report["systems"].items() if s["steps"]["points"]}
    if not systems:
        return None
    colors = system_colors(list(systems))
    fig, ax = subplots(figsize=(6.5, 5))
    lo, hi = float("inf"), 0.0
    for name, points in systems.items():
        for phase, marker in (("decode", "o"), ("prefill", "^")):
            xs = [p[0] * 1e3 for p in points if p[2] == phase]
            ys = [p[1] * 1e3 for p in points if p[2] == phase]
            if xs:
                ax.scatter(xs, ys, s=12, marker=marker, color=colors[name], alpha=0.6,
                           label=f"{name} {phase}")
                lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
    ax.plot([lo, hi], [lo, hi], "k--", linewidth=1, label="sim = measured")
    ax.set(xscale="log", yscale="log", xlabel="measured step (ms)", ylabel="simulated step (ms)",
           title="Step duration: sim against measured")
    ax.legend(fontsize=7, loc="upper left")
    return to_data_uri(fig)


def validation_section(report: dict) -> list[str]:
    """``<h2>`` and the section's parts (tables, the scatter)."""
    parts = ["<h2 id='validation'>Validation: sim against measured</h2>",
             f"<p class='meta'>{esc(_profiles_line(report))}; run {esc(report['run_dir'])}</p>",
             table(HEADER, figure_rows(report), text_columns=(0, 1, 6), digits=4, css_id="validate-table")]
    uri = scatter_uri(report)
    if uri:
        paired = all(s["steps"]["paired"] for s in report["systems"].values())
        parts.append(figure(uri, "simulated against measured step durations",
                            "Each point a step (paired by index: the sim ran the measured schedule)"
                            if paired else "Each point a bucket's mean step (schedules differ)"))
    parts += ["<h3>Steps by phase, batch and context bucket</h3>",
              table(BUCKET_HEADER, bucket_rows(report), text_columns=(0, 1), digits=3,
                    css_id="validate-buckets")]
    return parts


def render_validation(report: dict, out: Path) -> Path:
    """Write the validation section as a page at ``out``."""
    from harness.fileio import atomic_write_text

    atomic_write_text(out, page("pagebench validation", validation_section(report)))
    return out
