"""The capacity search's report (``capacity_report.html`` beside ``capacity.json`` at the
top of the sweep dir; ``harness.studies.capacity``): the headline, goodput and SLO
attainment against the arrival rate per system (every probe), and each search's answer."""

from __future__ import annotations

from pathlib import Path

from pagebench.reports.figures import subplots, system_colors, to_data_uri
from pagebench.reports.html import esc, figure, page, table

REPORT_NAME = "capacity_report.html"


def _label(point: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items()) or "default"


def goodput_figure(capacity: dict):
    """Per swept point, two panels: goodput and SLO attainment against the rate, one line
    per system over its probes; the target as a dashed line, each capacity as a dot."""
    searches = capacity["searches"]
    points = list(dict.fromkeys(_label(s["point"]) for s in searches))
    colors = system_colors(list(dict.fromkeys(s["system"] for s in searches)))
    target = capacity["settings"]["target_attainment"]
    fig, axes = subplots(len(points), 2, figsize=(11, 3.4 * len(points)), squeeze=False)
    for row, label in enumerate(points):
        good_ax, share_ax = axes[row]
        for search in (s for s in searches if _label(s["point"]) == label):
            probes = search["probes"]
            rates = [p["rate_rps"] for p in probes]
            color = colors[search["system"]]
            good_ax.plot(rates, [p["request_goodput"] or 0.0 for p in probes], "o-", color=color,
                         label=search["system"], markersize=3)
            share_ax.plot(rates, [100 * (p["slo_attainment"] or 0.0) for p in probes], "o-",
                          color=color, label=search["system"], markersize=3)
            if search["capacity_rps"] is not None:
                share_ax.axvline(search["capacity_rps"], color=color, lw=0.8, alpha=0.6)
        share_ax.axhline(100 * target, color="k", ls="--", lw=0.8)
        good_ax.set_xlabel("arrival rate (req/s)")
        share_ax.set_xlabel("arrival rate (req/s)")
        good_ax.set_ylabel("goodput (req/s)")
        share_ax.set_ylabel("SLO attainment (%)")
        good_ax.set_title(f"Goodput ({label})", fontsize=9)
        share_ax.set_title(f"SLO attainment ({label})", fontsize=9)
        good_ax.legend(fontsize=7)
    return fig


def render_capacity_report(sweep_dir: Path | str, capacity: dict) -> Path:
    """Write ``capacity_report.html`` for ``capacity`` (capacity.json's content)."""
    sweep_dir = Path(sweep_dir)
    settings, slo = capacity["settings"], capacity["slo"]
    slo_text = ", ".join(f"{k[:-3].upper()} <= {v:g} ms" for k, v in slo.items())
    parts = ["<h1>Capacity search: the highest rate each system sustains at the SLO</h1>",
             f"<p class='meta'>SLO: <b>{esc(slo_text)}</b>; target attainment "
             f"<b>{100 * settings['target_attainment']:g}%</b> of requests; bracketing from "
             f"{settings['start_rate']:g} req/s, then bisection to a relative tolerance of "
             f"{settings['rel_tol']:g}; {capacity['probes']} probes in {capacity['rounds']} "
             f"rounds, {capacity['wall_time_s']:.0f} s.</p>"]
    parts += [f"<p class='note'>{esc(line)}</p>" for line in capacity["headline"]]
    parts.append(figure(to_data_uri(goodput_figure(capacity)), "goodput against rate",
                        "Every probe is a full simulated run (its directory is in capacity.json). Right: the "
                        "dashed line is the target attainment, each vertical line a system's "
                        "capacity (its highest passing rate)."))
    rows = [[s["system"], _label(s["point"]), s["capacity_rps"], s["lowest_failing_rps"],
             len(s["probes"]), s["stop_reason"]] for s in capacity["searches"]]
    parts.append(table(["system", "point", "capacity (req/s)", "lowest failing (req/s)",
                        "probes", "stopped"], rows, text_columns=(0, 1, 5), digits=3,
                       css_id="capacity-table"))
    path = sweep_dir / REPORT_NAME
    path.write_text(page("pagebench capacity search", parts), encoding="utf-8")
    return path
