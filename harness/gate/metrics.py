"""The gated numbers of a results file, by metric name, and the job it belongs to."""

from __future__ import annotations

from typing import Any

# The per-system paths gated (each matched by a rule of ``rules.RULES``) and the ratio paths.
SYSTEM_PATHS = (
    "memory.token_states_pct", "memory.reserved_pct", "memory.internal_fragmentation_pct",
    "memory.external_fragmentation_pct", "memory.idle_pct", "memory.sharing_savings_pct",
    "batch.mean_seqs", "batch.max_seqs", "preemptions", "swaps", "prefix_cache.hit_rate",
    "requests.finished", "requests.rejected", "requests.unfinished",
    "throughput.requests_per_s", "throughput.output_tokens_per_s",
    "latency.ttft_s.p50", "latency.ttft_s.p99", "latency.tpot_s.p50", "latency.e2e_s.p50",
    "latency.e2e_s.p99", "latency.normalized_s_per_token.p50",
    # vLLM-named serving figures (harness.metrics.latency; percentiles as slo.percentiles
    # sets them, goodput only with an SLO set): absent or null ones are not gated
    "serving.median_ttft_ms", "serving.p99_ttft_ms", "serving.mean_tpot_ms",
    "serving.median_itl_ms", "serving.p99_itl_ms", "serving.p99_e2el_ms",
    "serving.request_goodput", "serving.slo_attainment",
)
RATIO_PATHS = ("throughput.output_tokens_per_s", "latency.e2e_s.p50")
# kernel_results.json (python -m harness run=kernels): within-run ratios per sweep point.
KERNEL_SCHEMA = "pagebench.kernel_bench/1"
KERNEL_RATIOS = ("paged_over_contiguous", "paged_frac_copy_bw")


def _get(tree: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


_ABSENT = object()


def job_key(results: dict) -> str:
    """A readable identity of the run, stable across code changes."""
    if results.get("schema") == KERNEL_SCHEMA:  # timings: only comparable on the same device
        return f"kernels/{results.get('device', {}).get('name', '?')}"
    w, m = results.get("workload", {}), results.get("model", {})
    hw = results.get("hardware", {})
    return (f"{w.get('name', '?')}/n{w.get('num_requests', '?')}/{m.get('name', '?')}/"
            f"{hw.get('name', '?')}/bs{results.get('block_size', '?')}/seed{results.get('seed', '?')}/"
            f"{results.get('executor', '?')}")


def extract_metrics(results: dict) -> dict[str, Any]:
    """The gated numbers of one results file, by metric name (insertion-ordered)."""
    if results.get("schema") == KERNEL_SCHEMA:
        return _kernel_metrics(results)
    systems = results["systems"]
    out: dict[str, Any] = {}
    for name, summary in systems.items():
        for path in SYSTEM_PATHS:
            value = _get(summary, path)
            if value is not _ABSENT and not (value is None and path.startswith("serving.")):
                out[f"{name}.{path}"] = value
    kinds = {name: _get(s, "allocator.kind") for name, s in systems.items()}
    for a, kind_a in kinds.items():
        if kind_a != "paged":
            continue
        for b, kind_b in kinds.items():
            if kind_b != "contiguous":
                continue
            for path in RATIO_PATHS:
                x, y = _get(systems[a], path), _get(systems[b], path)
                if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y:
                    out[f"ratio.{a}/{b}.{path}"] = round(x / y, 6)
    return out


def _kernel_metrics(results: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for row in results["rows"]:
        point = (f"{row.get('head_config')}/{row.get('dtype')}/b{row.get('batch')}/"
                 f"ctx{row.get('context_len')}/bs{row.get('block_size')}")
        for name in KERNEL_RATIOS:
            if row.get(name) is not None:
                out[f"kernel.{point}.{name}"] = row[name]
    return out


def is_complete(results: dict) -> bool:
    if results.get("schema") == KERNEL_SCHEMA:
        return not results.get("truncated", False)
    return results.get("complete") is True
