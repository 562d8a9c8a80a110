"""The offload figures results.json reports (``offload``): hits per tier, blocks and bytes
moved, and the share of TTFT the loads took (``engine.offload``: ``harness.config.offload``)."""

from __future__ import annotations

from harness.metrics.summaries import percentiles


def offload_figures(manager, scheduler, spec, block_size: int,
                    bytes_per_slot: int, load_cost) -> dict:
    """A run's offload figures that the manager and scheduler hold (``offload_summary``
    adds those of the step and request tables); ``spec`` is the run's ``engine.offload``."""
    tiers = manager.offload
    counts = tiers.counts()
    block_bytes = block_size * bytes_per_slot
    loaded = scheduler.offload_tokens_cached
    queried = scheduler.prompt_tokens_queried
    hits = {"gpu": scheduler.prompt_tokens_cached - loaded["cpu"] - loaded["disk"],
            "cpu": loaded["cpu"], "disk": loaded["disk"]}
    moved = {way: counts[way] * block_bytes
             for way in ("gpu_to_cpu", "cpu_to_disk", "cpu_to_gpu", "disk_to_gpu")}
    return {
        # [request id, seconds its own loads took], for the per-request share of TTFT
        "_request_load_s": [(rid, cpu * load_cost.cpu_slot_s + disk * load_cost.disk_slot_s)
                            for rid, (cpu, disk) in scheduler.offload_loads.items()],
        "cpu_gib": spec.cpu_gib, "disk_gib": spec.disk_gib,
        "cpu_blocks": tiers.cpu_blocks, "disk_blocks": tiers.disk_blocks,
        "block_bytes": block_bytes,
        "hit_tokens": hits,
        "hit_rate": {tier: round(tokens / queried, 6) if queried else None
                     for tier, tokens in hits.items()},
        "blocks_moved": counts,
        "bytes_moved": moved,
        "load_s_per_slot": {"cpu": load_cost.cpu_slot_s, "disk": load_cost.disk_slot_s},
        # stores run asynchronously (vLLM's offloading connector, LMCache): never charged;
        # the time each link would be busy with them, to compare with the run's length
        "async_store_busy_s": {
            "gpu_to_cpu": round(moved["gpu_to_cpu"] / (load_cost.host_link_gbps * 1e9), 6),
            "cpu_to_disk": round(moved["cpu_to_disk"] / (spec.disk_write_gbps * 1e9), 6)},
    }


def offload_summary(figures: dict, steps, requests) -> dict:
    """``figures`` with the load time: its total (the steps' ``offload_load_s``), its share of
    the finished requests' summed TTFT (the load delays the step that admits them), and per
    finished request the share of its TTFT its own loads took (percentiles, 0 for a request
    that loaded nothing)."""
    import numpy as np

    figures = dict(figures)
    own = dict(figures.pop("_request_load_s"))
    load_s = float(steps["offload_load_s"].sum()) if "offload_load_s" in steps else 0.0
    done = requests[requests["status"] == "finished"]
    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy(dtype=float)
    mine = np.array([own.get(rid, 0.0) for rid in done["request_id"].tolist()], dtype=float)
    positive = ttft > 0
    total = float(ttft.sum())
    return {**figures, "load_s": round(load_s, 6),
            "load_share_of_ttft": round(load_s / total, 6) if total > 0 else None,
            "request_load_share_of_ttft": percentiles(mine[positive] / ttft[positive])}
