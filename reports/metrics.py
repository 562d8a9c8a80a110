"""Headline metrics of one system's summary in results.json, shared by run and sweep reports.

Each metric says what it is with its unit, so every axis and table column built from
it is labelled the same way everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


def _get(summary: dict, *path: str) -> float | None:
    node: Any = summary
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return float(node) if math.isfinite(node) else None


def waste_pct(summary: dict) -> float | None:
    """Share of the memory in use (everything but idle) that holds no token state, in %.

    NOTE: this is the article's "waste" (reservation + internal + external
    fragmentation); dividing by memory in use rather than the whole pool makes an
    unsaturated run comparable with the article's saturated measurements.
    """
    token_states = _get(summary, "memory", "token_states_pct")
    idle = _get(summary, "memory", "idle_pct")
    if token_states is None or idle is None or idle >= 100.0 - 1e-9:
        return None
    # rounded as results.json rounds the percentages it is made of (4 decimals)
    return round(max(0.0, 100.0 * (1.0 - token_states / (100.0 - idle))), 4)


def energy_per_token_j(summary: dict) -> float | None:
    """Joules per generated token, when the run measured energy (NVML)."""
    for path in (("energy", "joules_per_output_token"), ("energy", "j_per_output_token"),
                 ("energy_per_token_j",), ("nvml", "energy_per_output_token_j"),
                 ("nvml", "joules_per_output_token")):
        value = _get(summary, *path)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class Metric:
    key: str
    label: str  # with its unit: used as axis label and column header
    get: Callable[[dict], float | None]
    group: str  # "memory" | "serving" | "telemetry"


HEADLINE_METRICS: tuple[Metric, ...] = (
    Metric("token_states_pct", "token states (% of KV pool)",
           lambda s: _get(s, "memory", "token_states_pct"), "memory"),
    Metric("waste_pct", "waste (% of KV memory in use)", waste_pct, "memory"),
    Metric("internal_fragmentation_pct", "internal fragmentation (% of pool)",
           lambda s: _get(s, "memory", "internal_fragmentation_pct"), "memory"),
    # a layer-group manager's only (paged_hybrid: its summary has layer_groups); every other
    # manager's pages hold one kind, so its padding is 0 by construction, not a measurement
    Metric("internal_page_padding_pct", "page padding (% of pool; unified pages)",
           lambda s: _get(s, "memory", "internal_page_padding_pct") if "layer_groups" in s
           else None, "memory"),
    Metric("external_fragmentation_pct", "external fragmentation (% of pool)",
           lambda s: _get(s, "memory", "external_fragmentation_pct"), "memory"),
    Metric("sharing_savings_pct", "sharing savings (% of logical tokens)",
           lambda s: _get(s, "memory", "sharing_savings_pct"), "memory"),
    Metric("prefix_hit_rate_pct", "prefix-cache hit rate (% of prompt tokens)",
           lambda s: None if _get(s, "prefix_cache", "hit_rate") is None
           else 100.0 * _get(s, "prefix_cache", "hit_rate"), "memory"),
    # engine.offload (results.json ``offload``; None without a tier): hits by tier
    *(Metric(f"offload_{tier}_hit_pct", f"{name} prefix hits (% of prompt tokens)",
             lambda s, tier=tier: None if _get(s, "offload", "hit_rate", tier) is None
             else 100.0 * _get(s, "offload", "hit_rate", tier), "memory")
      for tier, name in (("gpu", "GPU-pool"), ("cpu", "CPU-tier"), ("disk", "disk-tier"))),
    Metric("offload_load_share_pct", "offload load time (% of summed TTFT)",
           lambda s: None if _get(s, "offload", "load_share_of_ttft") is None
           else 100.0 * _get(s, "offload", "load_share_of_ttft"), "serving"),
    Metric("mean_batch", "mean batch size (sequences)",
           lambda s: _get(s, "batch", "mean_seqs"), "serving"),
    Metric("requests_per_s", "throughput (requests/s)",
           lambda s: _get(s, "throughput", "requests_per_s"), "serving"),
    Metric("output_tokens_per_s", "throughput (output tokens/s)",
           lambda s: _get(s, "throughput", "output_tokens_per_s"), "serving"),
    Metric("ttft_p50_s", "TTFT p50 (s)", lambda s: _get(s, "latency", "ttft_s", "p50"), "serving"),
    Metric("ttft_p99_s", "TTFT p99 (s)", lambda s: _get(s, "latency", "ttft_s", "p99"), "serving"),
    Metric("tpot_p50_s", "TPOT p50 (s/token)", lambda s: _get(s, "latency", "tpot_s", "p50"),
           "serving"),
    Metric("e2e_p99_s", "end-to-end latency p99 (s)", lambda s: _get(s, "latency", "e2e_s", "p99"),
           "serving"),
    # vLLM-named figures (results.json ``serving``); goodput and attainment with an SLO set
    Metric("itl_p99_ms", "ITL p99 (ms)", lambda s: _get(s, "serving", "p99_itl_ms"), "serving"),
    Metric("request_goodput", "goodput at the SLO (requests/s)",
           lambda s: _get(s, "serving", "request_goodput"), "serving"),
    Metric("slo_attainment_pct", "SLO attainment (% of requests)",
           lambda s: None if _get(s, "serving", "slo_attainment") is None
           else 100.0 * _get(s, "serving", "slo_attainment"), "serving"),
    Metric("normalized_latency_s_per_token", "normalized latency, mean (s/token)",
           lambda s: _get(s, "latency", "normalized_s_per_token", "mean"), "serving"),
    Metric("preemptions", "preemptions (count)", lambda s: _get(s, "preemptions"), "serving"),
    Metric("energy_per_token_j", "energy per output token (J)", energy_per_token_j, "telemetry"),
)


def headline_values(summary: dict) -> dict[str, float | None]:
    """Every headline metric of one system summary (None where not measured)."""
    return {m.key: m.get(summary) for m in HEADLINE_METRICS}
