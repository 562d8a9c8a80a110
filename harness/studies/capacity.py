"""Capacity search: per system and swept point, the highest arrival rate whose SLO
attainment stays at a target (Vidur's capacity search; vLLM's ``serve_sla`` sweep).

One ``RateSearch`` per (system, point of the swept parameters) brackets, then bisects:
it probes ``start_rate``; while attainment >= target it doubles the rate (until one
fails), while it is below it halves (until one passes, or ``min_rate`` fails too); then
it bisects between the highest passing rate ``lo`` and the lowest failing ``hi`` until
``hi / lo - 1 <= rel_tol``. The answer is ``lo``: a rate measured to meet the target,
within ``rel_tol`` of the knee (assuming attainment falls with the rate).

A search wants one probe at a time, so the searches advance in rounds: each round asks
every open search for its next rate, runs all those probes at once (the Hydra sweeper
``hydra_plugins.pagebench_capacity`` launches them through the configured launcher), and
feeds each its result. ``capacity.json`` (``capacity_result``) records every probe with
its run directory, each search's answer, and the headline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Probe:
    """One simulated run of one system at one rate."""

    rate: float
    attainment: float | None
    goodput: float | None
    throughput: float | None
    run_dir: str


@dataclass
class RateSearch:
    """Bracketing, then bisection on the arrival rate of one (system, point)."""

    system: str
    point: dict[str, str]  # the swept parameters' overrides (key -> value as written)
    start_rate: float
    target: float = 0.9
    rel_tol: float = 0.05
    min_rate: float = 0.01
    max_rate: float = 1000.0
    max_probes: int = 20
    probes: list[Probe] = field(default_factory=list)
    lo: float | None = None  # highest rate that met the target
    hi: float | None = None  # lowest rate that missed it
    stop_reason: str | None = None

    def __post_init__(self) -> None:
        if not (0 < self.min_rate <= self.start_rate <= self.max_rate):
            raise ValueError("need 0 < min_rate <= start_rate <= max_rate")

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def next_rate(self) -> float | None:
        """The rate to probe next, or None once the search has ended."""
        if self.done:
            return None
        if len(self.probes) >= self.max_probes:
            self.stop_reason = f"max_probes={self.max_probes} reached"
            return None
        if not self.probes:
            return self.start_rate
        lo, hi = self.lo, self.hi
        if lo is None:  # every probe failed: halve, down to min_rate
            if hi <= self.min_rate:
                self.stop_reason = f"even min_rate={self.min_rate:g} req/s misses the target"
                return None
            return max(hi / 2, self.min_rate)
        if hi is None:  # every probe passed: double
            if lo >= self.max_rate:
                self.stop_reason = f"max_rate={self.max_rate:g} req/s still meets the target"
                return None
            return min(lo * 2, self.max_rate)
        if hi / lo - 1 <= self.rel_tol:
            self.stop_reason = "converged"
            return None
        return (lo + hi) / 2

    def record(self, probe: Probe) -> None:
        """Feed the result of the probe at ``next_rate()``."""
        self.probes.append(probe)
        meets = probe.attainment is not None and probe.attainment >= self.target
        if meets:
            self.lo = probe.rate if self.lo is None else max(self.lo, probe.rate)
        else:
            self.hi = probe.rate if self.hi is None else min(self.hi, probe.rate)
        if self.lo is not None and self.hi is not None and self.hi <= self.lo:
            # attainment is not monotone in the rate here: keep the bracket's meaning
            self.stop_reason = (f"attainment not monotone: {self.hi:g} req/s missed the target "
                                f"below {self.lo:g} req/s, which met it")

    def result(self) -> dict:
        """The search's entry in capacity.json."""
        return {
            "system": self.system, "point": self.point,
            "capacity_rps": self.lo, "lowest_failing_rps": self.hi,
            "converged": self.stop_reason == "converged", "stop_reason": self.stop_reason,
            "probes": [{"rate_rps": p.rate, "slo_attainment": p.attainment,
                        "request_goodput": p.goodput, "request_throughput": p.throughput,
                        "meets_target": p.attainment is not None and p.attainment >= self.target,
                        "run_dir": p.run_dir} for p in sorted(self.probes, key=lambda p: p.rate)],
        }


def point_label(point: dict[str, str]) -> str:
    """``block_size=16 engine.kv_capacity_slots=40000`` (or ``default``)."""
    return " ".join(f"{k}={v}" for k, v in point.items()) or "default"


def headline(searches: list[dict], kinds: dict[str, str]) -> list[str]:
    """One sentence per swept point: the paged system's capacity and the best contiguous
    one's (``kinds``: system name -> allocator kind)."""
    lines = []
    points: dict[str, list[dict]] = {}
    for search in searches:
        points.setdefault(point_label(search["point"]), []).append(search)
    for label, group in points.items():
        def best(kind: str) -> dict | None:
            found = [s for s in group if kinds.get(s["system"]) == kind]
            return max(found, key=lambda s: s["capacity_rps"] or 0.0) if found else None

        def says(s: dict) -> str:
            rate = s["capacity_rps"]
            return f"{s['system']} sustains " + ("no probed rate" if rate is None
                                                 else f"{rate:.3g} req/s")

        paged, contiguous = best("paged"), best("contiguous")
        parts = [says(s) for s in (paged, contiguous) if s is not None]
        if not parts:
            parts = [says(s) for s in group]
        if paged is not None and contiguous is not None:
            parts[1] = "the best contiguous system, " + parts[1]
            if paged["capacity_rps"] and contiguous["capacity_rps"]:
                parts.append(f"{paged['capacity_rps'] / contiguous['capacity_rps']:.2f}x")
        where = "" if label == "default" else f" ({label})"
        lines.append(f"At the SLO{where}: " + "; ".join(parts))
    return lines


def capacity_result(searches: list[RateSearch], settings: dict[str, Any], kinds: dict[str, str],
                    slo: dict, wall_time_s: float, rounds: int) -> dict:
    """capacity.json: the settings, the SLO, every search with its probes, the headline."""
    results = [s.result() for s in searches]
    return {
        "kind": "capacity_search",
        "settings": settings, "slo": slo, "rounds": rounds,
        "probes": sum(len(s.probes) for s in searches),
        "wall_time_s": round(wall_time_s, 2),
        "searches": results,
        "headline": headline(results, kinds),
        "note": ("capacity_rps: the highest probed rate whose SLO attainment met the target; "
                 "the knee lies below lowest_failing_rps (within rel_tol when converged)"),
    }
