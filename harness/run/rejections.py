"""What to tell the user about requests a system rejected at arrival.

The engine rejects a request that can never run on a system (``rejection_reason`` in
``harness.engine.engine``) and counts it; the system's figures then cover only the
requests it served, so systems that rejected different requests are not compared on
the same work. A run says so on the console and in results.json (``warnings``), and a
system that could serve no request at all makes the run incomplete.
"""

from __future__ import annotations

SERVED_NOTHING = "no request can run on"  # how the stop_reason of such a run begins

# What to change for each rejection reason.
FIXES = {
    "longer_than_max_model_len": "raise engine.max_model_len (within the model's context)",
    "larger_than_pool": "raise engine.kv_capacity_slots or use larger hardware",
    "group_larger_than_pool": "raise engine.kv_capacity_slots or use larger hardware",
    "more_sequences_than_max_num_seqs": "raise engine.max_num_seqs",
    "prompt_exceeds_max_num_batched_tokens": "raise engine.max_num_batched_tokens or set "
                                             "engine.chunked_prefill=true",
}


def rejection_warnings(systems: dict[str, dict], num_requests: int, capacity_slots: int) -> list[str]:
    """One line per system (``results.json``'s ``systems``) that rejected requests."""
    lines = []
    for name, summary in systems.items():
        reasons = summary.get("rejected_reasons") or {}
        rejected = sum(reasons.values())
        if not rejected:
            continue
        served = summary["requests"]["finished"]
        fixes = "; ".join(dict.fromkeys(FIXES.get(reason, "see the request table") for reason in reasons))
        allocator = summary.get("allocator") or {}
        if allocator.get("kind") == "contiguous" and allocator.get("arena") == "buddy":
            fixes += " (a buddy arena's largest extent is the largest power of two in the pool)"
        counts = ", ".join(f"{reason}: {count}" for reason, count in reasons.items())
        lines.append(f"{name} rejected {rejected} of {num_requests} requests that can never run on "
                     f"it ({counts}; the KV pool holds {capacity_slots} slots); its figures cover "
                     f"the {served} it served. To run them: {fixes}")
    return lines


def systems_that_served_nothing(systems: dict[str, dict], num_requests: int) -> list[str]:
    """The systems that rejected every one of ``num_requests`` (> 0) requests."""
    return [name for name, summary in systems.items()
            if num_requests and sum((summary.get("rejected_reasons") or {}).values()) == num_requests]
