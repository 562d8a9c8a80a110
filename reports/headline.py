"""The top of the run report: the offered load against what each system served (with a
plain note when queueing dominates latency) and the one-sentence verdict of what paging
bought."""

from __future__ import annotations

from pagebench.reports.html import esc, fmt
from pagebench.reports.metrics import waste_pct


def load_parts(results: dict) -> list[str]:
    """The offered load, and a plain note when queueing dominates latency (pagebench.reports.summary)."""
    from pagebench.reports.summary import load_figures, overload_lines

    workload = results.get("workload") or {}
    offered, span = workload.get("mean_rate_rps"), workload.get("arrival_span_s")
    if not isinstance(offered, (int, float)) or not isinstance(span, (int, float)):
        return []
    served = [f"{esc(name)} {fmt(load_figures(results, name)['served_rps'])} req/s"
              for name in results.get("systems") or {}]
    parts = [f"<p class='meta' id='load'>Offered load <b>{fmt(float(offered))} req/s</b> over a "
             f"{fmt(float(span), 0)} s trace; served: {', '.join(served)}.</p>"]
    overload = overload_lines(results)
    if overload is not None:
        sentence, lines = overload
        parts.append(f"<div class='note' id='overload'>{esc(sentence)}<ul>"
                     + "".join(f"<li>{esc(line)}</li>" for line in lines) + "</ul></div>")
    return parts


def headline_sentence(systems: dict[str, dict]) -> str | None:
    """What paging bought on this workload, in one sentence: the paged and the contiguous
    system that wasted the least KV memory (the quantity the sentence leads with)."""
    paged = {n: s for n, s in systems.items() if s.get("allocator", {}).get("kind") == "paged"}
    contiguous = {n: s for n, s in systems.items()
                  if s.get("allocator", {}).get("kind") == "contiguous"}
    if not paged or not contiguous:
        return None
    if len({s["requests"]["rejected"] for s in systems.values()}) > 1:
        return None  # they served different requests (the warnings say which): no comparison

    def least_waste(group: dict[str, dict]) -> str | None:  # then the higher throughput
        measured = {n: s for n, s in group.items() if waste_pct(s) is not None}
        return min(measured, key=lambda n: (waste_pct(measured[n]),
                                            -(measured[n]["throughput"]["requests_per_s"] or 0.0)),
                   default=None)

    p_name, c_name = least_waste(paged), least_waste(contiguous)
    if p_name is None or c_name is None:
        return None  # a group used no memory: nothing to compare
    p, c = paged[p_name], contiguous[c_name]

    def ratio(a, b):
        return f"{a / b:.2f}×" if a and b else "–"

    return (f"On this workload <b>{esc(p_name)}</b> left {fmt(waste_pct(p), 1)}% of the KV memory "
            f"it used without token states vs {fmt(waste_pct(c), 1)}% for the contiguous "
            f"system that wasted the least (<b>{esc(c_name)}</b>), ran a mean batch of "
            f"{fmt(p['batch']['mean_seqs'], 1)} vs {fmt(c['batch']['mean_seqs'], 1)} sequences "
            f"({ratio(p['batch']['mean_seqs'], c['batch']['mean_seqs'])}) and served "
            f"{ratio(p['throughput']['requests_per_s'], c['throughput']['requests_per_s'])} "
            "the requests per second.")
