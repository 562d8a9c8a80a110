"""vLLM-style serving figures (results.json ``serving``: ``harness.metrics.latency``) in
the console summary and the run report: TTFT, TPOT, ITL and E2EL in milliseconds at the
run's percentiles, and goodput and SLO attainment when the run set an SLO."""

from __future__ import annotations

from pagebench.reports.html import esc, table

METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))


def _percentile_keys(serving: dict) -> list[str]:
    """The run's percentile names (``p50``, ``p99.9``), in results.json order."""
    return [key[:-len("_ttft_ms")] for key in serving
            if key.startswith("p") and key.endswith("_ttft_ms")]


def _servings(systems: dict[str, dict]) -> dict[str, dict]:
    return {n: s["serving"] for n, s in systems.items() if isinstance(s.get("serving"), dict)}


def slo_text(serving: dict) -> str:
    """``TTFT <= 500 ms, TPOT <= 50 ms`` (or ``no SLO set``)."""
    slo = serving.get("slo") or {}
    names = dict(METRICS)
    parts = [f"{names.get(k[:-3], k)} <= {v:g} ms" for k, v in slo.items()]
    return ", ".join(parts) if parts else "no SLO set"


def console_lines(systems: dict[str, dict]) -> list[str]:
    """The console's latency table: median and highest percentile of each metric (ms),
    goodput and SLO attainment; nothing when no system has the figures."""
    servings = _servings(systems)
    if not servings:
        return []
    first = next(iter(servings.values()))
    top = (_percentile_keys(first) or ["median"])[-1]
    header = [""]
    for _, label in METRICS:
        header += [f"{label} med", f"{label} {top}"]
    with_slo = any(s.get("request_goodput") is not None for s in servings.values())
    if with_slo:
        header += ["goodput req/s", "SLO %"]
    rows = [header]
    for name, s in servings.items():
        row = [name]
        for key, _ in METRICS:
            for stat in ("median", top):
                value = s.get(f"{stat}_{key}_ms")
                row.append("-" if value is None else f"{value:,.1f}")
        if with_slo:
            goodput, share = s.get("request_goodput"), s.get("slo_attainment")
            row += ["-" if goodput is None else f"{goodput:.2f}",
                    "-" if share is None else f"{100 * share:.1f}"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"latency (ms; as vllm bench serve){'; SLO: ' + slo_text(first) if with_slo else ''}:"]
    lines += ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    return lines


def serving_metrics_section(systems: dict[str, dict]) -> list[str]:
    """The run report's table of the vLLM-named figures per system (``<h3>`` and table),
    or nothing when results.json has none (a run from before them)."""
    servings = _servings(systems)
    if not servings:
        return []
    first = next(iter(servings.values()))
    stats = ["mean", "median", *_percentile_keys(first)]
    header = ["system"] + [f"{label} {stat} (ms)" for _, label in METRICS for stat in stats]
    rows = [[name] + [s.get(f"{stat}_{key}_ms") for key, _ in METRICS for stat in stats]
            for name, s in servings.items()]
    parts = ["<h3>Serving latency as vllm bench serve reports it (milliseconds)</h3>",
             "<p class='note'>TTFT: first token - arrival; TPOT: (E2EL - TTFT) / (output "
             "tokens - 1) per request (outputs of two tokens or more); ITL: every gap between "
             "a request's consecutive output tokens (TPOT is their mean per request; "
             "single-sequence requests); E2EL: finish - arrival. results.json: "
             "systems.NAME.serving (mean_ttft_ms, p99_itl_ms, ...).</p>",
             "<div class='scroll'>" + table(header, rows, digits=1, css_id="serving-metrics-table")
             + "</div>"]
    if any(s.get("request_goodput") is not None for s in servings.values()):
        rows = [[name, s.get("completed"), s.get("good_completed"), s.get("request_throughput"),
                 s.get("request_goodput"),
                 None if s.get("slo_attainment") is None else 100 * s["slo_attainment"]]
                for name, s in servings.items()]
        parts += [f"<h3>Goodput at the SLO ({esc(slo_text(first))})</h3>",
                  "<p class='note'>A finished request is good when it meets every target "
                  "(TPOT does not apply to a one-token output); goodput = good requests per "
                  "second of the run (DistServe; vLLM's --goodput); SLO attainment = good "
                  "requests / all requests, rejected and unfinished ones included.</p>",
                  table(["system", "finished", "good", "requests/s", "goodput (req/s)",
                         "SLO attainment (%)"], rows, digits=3, css_id="goodput-table")]
    return parts

