"""The gate's rules: which direction of each metric is better, and how much change is
tolerated (first matching rule wins)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Rule:
    """How one family of metrics is gated (``metric`` is an fnmatch pattern)."""

    metric: str
    better: str  # "higher" | "lower" | "equal" (any move is a change) | "info" (never gated)
    abs_tol: float = 0.0  # sim executor: allowed |current - baseline|
    rel_tol: float = 0.0  # sim executor: ... or this fraction of |baseline|, if larger
    noise_band: float | None = None  # measured executors: relative band; None = not gated
    why: str = ""

    def describe(self, deterministic: bool) -> str:
        if self.better == "info":
            return "info"
        direction = {"higher": "higher better", "lower": "lower better",
                     "equal": "no change"}[self.better]
        if deterministic:
            parts = []
            if self.abs_tol or not self.rel_tol:
                parts.append(f"±{self.abs_tol:g}")
            if self.rel_tol:
                parts.append(f"±{self.rel_tol:.0e} rel")
            return f"{direction}, {' or '.join(parts)} (sim)"
        if self.noise_band is None:
            return "info (timing: no noise band)"
        return f"{direction}, ±{self.noise_band:.0%} noise band"


_MEM = "deterministic on sim; percent of capacity, step-weighted (results round to 1e-4)"
_SIMTIME = "simulated time on sim (deterministic); depends on the machine when measured"
_SIMTIME_MS = ("milliseconds of simulated time on sim (deterministic; results round to 1e-6 ms): "
               "a microsecond's change fails")
_RATIO = "paged vs contiguous measured in the same run: machine speed cancels"

#: The gate's rules, first match wins. Edit a copy with --show-rules / --rules.
RULES: tuple[Rule, ...] = (
    Rule("*.memory.token_states_pct", "higher", abs_tol=0.01, why=_MEM),
    Rule("*.memory.reserved_pct", "lower", abs_tol=0.01, why=_MEM),
    Rule("*.memory.internal_fragmentation_pct", "lower", abs_tol=0.01, why=_MEM),
    Rule("*.memory.external_fragmentation_pct", "lower", abs_tol=0.01, why=_MEM),
    Rule("*.memory.sharing_savings_pct", "higher", abs_tol=0.01, why=_MEM),
    Rule("*.memory.idle_pct", "info", why="the complement of the gated categories"),
    Rule("*.batch.mean_seqs", "higher", abs_tol=0.01, why="step-weighted mean batch size"),
    Rule("*.batch.max_seqs", "higher", abs_tol=0, why="deterministic count"),
    Rule("*.preemptions", "lower", abs_tol=0, why="deterministic count"),
    Rule("*.swaps", "lower", abs_tol=0, why="deterministic count"),
    Rule("*.prefix_cache.hit_rate", "higher", abs_tol=1e-4, why="fraction of prompt tokens"),
    Rule("*.requests.finished", "higher", abs_tol=0, why="deterministic count"),
    Rule("*.requests.rejected", "lower", abs_tol=0, why="deterministic count"),
    Rule("*.requests.unfinished", "lower", abs_tol=0, why="deterministic count"),
    Rule("ratio.*.throughput.output_tokens_per_s", "higher", rel_tol=1e-4, noise_band=0.10,
         why=_RATIO),
    Rule("ratio.*.latency.e2e_s.p50", "lower", rel_tol=1e-4, noise_band=0.10, why=_RATIO),
    Rule("kernel.*.paged_over_contiguous", "lower", noise_band=0.10,
         why="paged / contiguous kernel time, measured back to back in one run"),
    Rule("kernel.*.paged_frac_copy_bw", "higher", noise_band=0.10,
         why="paged kernel bandwidth / device copy bandwidth, measured in one run"),
    Rule("*.throughput.requests_per_s", "higher", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.throughput.output_tokens_per_s", "higher", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.ttft_s.p50", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.ttft_s.p99", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.tpot_s.p50", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.e2e_s.p50", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.e2e_s.p99", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.latency.normalized_s_per_token.p50", "lower", rel_tol=1e-4, why=_SIMTIME),
    Rule("*.serving.*_ms", "lower", abs_tol=1e-3, noise_band=0.10, why=_SIMTIME_MS),
    Rule("*.serving.request_goodput", "higher", abs_tol=1e-6, noise_band=0.10,
         why="good requests per second of simulated time (deterministic on sim)"),
    Rule("*.serving.slo_attainment", "higher", abs_tol=1e-6, noise_band=0.05,
         why="share of requests within the SLO (deterministic on sim; results round to 1e-6)"),
)


def rule_for(metric: str, rules: Iterable[Rule]) -> Rule | None:
    for rule in rules:
        if fnmatch.fnmatchcase(metric, rule.metric):
            return rule
    return None
