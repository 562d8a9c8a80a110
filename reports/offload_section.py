"""The run report's table of the offload tiers (``engine.offload``, results.json ``offload``):
per system, the prefix hits by tier, TTFT, the loads' share of it and the bytes moved.
The sweep report compares the tier on and off (``pagebench.reports.metrics``' offload metrics)."""

from __future__ import annotations

from pagebench.reports.html import table

GIB = 1024**3


def _pct(value) -> float | None:
    return None if value is None else 100.0 * value


def offload_table(systems: dict[str, dict]) -> list[str]:
    """``<h3>`` and the table, or nothing when no system ran with an offload tier."""
    rows = []
    for name, s in systems.items():
        tier = s.get("offload")
        if not isinstance(tier, dict):
            continue
        rate = tier.get("hit_rate") or {}
        moved = tier.get("bytes_moved") or {}
        ttft = ((s.get("latency") or {}).get("ttft_s")) or {}
        rows.append([name, f"{tier.get('cpu_gib')} + {tier.get('disk_gib')}",
                     _pct(rate.get("gpu")), _pct(rate.get("cpu")), _pct(rate.get("disk")),
                     ttft.get("p50"), ttft.get("p99"), _pct(tier.get("load_share_of_ttft")),
                     moved.get("gpu_to_cpu", 0) / GIB, moved.get("cpu_to_disk", 0) / GIB,
                     (moved.get("cpu_to_gpu", 0) + moved.get("disk_to_gpu", 0)) / GIB])
    if not rows:
        return []
    header = ["system", "CPU + disk tier (GiB)", "GPU hits (% of prompt tokens)", "CPU hits (%)",
              "disk hits (%)", "TTFT p50 (s)", "TTFT p99 (s)", "load time (% of summed TTFT)",
              "GPU to CPU (GiB)", "CPU to disk (GiB)", "loaded to GPU (GiB)"]
    note = ("<p class='note'>Prefix-cache blocks evicted from the GPU pool move to the CPU "
            "tier, then disk (LRU each); a prompt whose cached run continues there loads those "
            "blocks in the step that admits it (column offload_load_s of steps_*.csv). Stores "
            "are asynchronous: counted, not charged. The sweep of experiment=offload compares "
            "the tier on and off.</p>")
    return ["<h3>Offload tiers (hits by tier, TTFT, bytes moved)</h3>", note,
            table(header, rows, text_columns=(0, 1), digits=3, css_id="offload-table")]
