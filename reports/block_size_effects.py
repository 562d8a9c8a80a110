"""Block size, split into its two effects: memory (packing) and time (the decode kernel).

For the paged system at each block size of a sweep (``experiment=block_size_sweep``) or
of the Fig. 18b study (``experiment=vllm_fig18b``):

* the *memory effect*: the pool share lost to block rounding (the last block of each
  sequence, partly filled), and what it does to the batch and the preemptions;
* the *time effect*: the decode kernel's seconds per KV token read (the operator cost
  model's ``attention_decode`` time over the KV slots the decodes read: it depends on the
  block size through the kernel profile, not on the batch the memory allows);

then where the lowest normalized latency falls and which effect bounds it on each side.
Needs runs priced by the operator cost model (``cost_model.decode_read_slots`` and
``time_by_phase_s`` in each system's results); without them the section says so.
"""

from __future__ import annotations

from typing import Any

from pagebench.reports import figures as F
from pagebench.reports.html import absent, esc, figure, table


def effect_rows(points: list[tuple[int, dict]]) -> list[dict]:
    """One row per block size (ascending) from ``(block_size, system summary)`` pairs."""
    rows = []
    for block, summary in sorted(points, key=lambda p: p[0]):
        cost = summary.get("cost_model") or {}
        phases = summary.get("time_by_phase_s") or {}
        read = cost.get("decode_read_slots")
        kernel = (1e9 * phases["attention_decode"] / read
                  if read and phases.get("attention_decode") is not None else None)
        latency = ((summary.get("latency") or {}).get("normalized_s_per_token") or {}).get("mean")
        rows.append({"block_size": block, "kernel_ns_per_token": kernel,
                     "rounding_pct": (summary.get("memory") or {}).get("internal_rounding_pct"),
                     "mean_batch": (summary.get("batch") or {}).get("mean_seqs"),
                     "preemptions": summary.get("preemptions"), "latency": latency})
    return rows


def explain(rows: list[dict]) -> str:
    """Where the optimum falls and why, in one paragraph (plain text)."""
    timed = [r for r in rows if r["latency"] is not None]
    if not timed:
        return "No block size finished with a latency."
    best = min(timed, key=lambda r: r["latency"])
    first, last = rows[0], rows[-1]
    parts = [f"Lowest normalized latency at block {best['block_size']} "
             f"({best['latency']:.4g} s/token)."]
    if best is not first and first["kernel_ns_per_token"] and best["kernel_ns_per_token"]:
        parts.append(f"Below it the time effect dominates: the decode kernel takes "
                     f"{first['kernel_ns_per_token'] / best['kernel_ns_per_token']:.2f}x as long per "
                     f"KV token at block {first['block_size']} ({first['kernel_ns_per_token']:.3g} vs "
                     f"{best['kernel_ns_per_token']:.3g} ns), with "
                     f"{first['preemptions']:,} preemptions vs {best['preemptions']:,}.")
    if best is not last and last["rounding_pct"] is not None and best["rounding_pct"] is not None:
        parts.append(f"Above it the memory effect dominates: block rounding holds "
                     f"{last['rounding_pct']:.2f}% of the pool at block {last['block_size']} vs "
                     f"{best['rounding_pct']:.2f}%, the mean batch is {last['mean_batch']:.1f} vs "
                     f"{best['mean_batch']:.1f} and preemptions {last['preemptions']:,} vs "
                     f"{best['preemptions']:,}.")
    return " ".join(parts)


def effects_figure(rows: list[dict], title: str):
    """Three panels against block size: kernel ns per KV token (time), rounding waste and
    mean batch (memory), normalized latency (the outcome)."""
    import matplotlib.pyplot as plt

    sizes = [r["block_size"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
    panels = [("kernel_ns_per_token", "decode kernel ns per KV token", "time effect"),
              ("rounding_pct", "block rounding (% of pool)", "memory effect"),
              ("latency", "normalized latency (s/token)", "outcome")]
    for ax, (key, label, what) in zip(axes, panels):
        ys = [float("nan") if r[key] is None else r[key] for r in rows]
        ax.plot(sizes, ys, marker="o", color="#1f77b4")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (tokens)")
        ax.set_ylabel(label)
        ax.set_title(what, fontsize=9)
        if key == "rounding_pct":
            twin = ax.twinx()
            twin.plot(sizes, [float("nan") if r["mean_batch"] is None else r["mean_batch"]
                              for r in rows], marker="s", color="#ff7f0e")
            twin.set_ylabel("mean batch (sequences)", color="#ff7f0e")
    fig.suptitle(title, x=0.02, ha="left", fontsize=10)
    fig.tight_layout()
    return fig


def effects_section(points: list[tuple[int, dict]], title: str) -> str:
    """The HTML section for one panel: figure, table and explanation."""
    rows = effect_rows(points)
    if len(rows) < 2 or all(r["kernel_ns_per_token"] is None for r in rows):
        return absent(f"{title}: block-size effects (needs two or more block sizes priced by "
                      "engine.cost.model=operator)")
    header = ["block size", "kernel ns / KV token (time)", "rounding % of pool (memory)",
              "mean batch", "preemptions", "normalized latency (s/token)"]
    body = [[r["block_size"], r["kernel_ns_per_token"], r["rounding_pct"], r["mean_batch"],
             r["preemptions"], r["latency"]] for r in rows]
    parts = [f"<h3>{esc(title)}</h3>"]
    try:
        parts.append(figure(F.to_data_uri(effects_figure(rows, title)), f"{title} block-size effects",
                            "Left: the time effect (the decode kernel's cost per KV token, "
                            "from the kernel profile); middle: the memory effect (pool lost to "
                            "block rounding, and the batch it leaves); right: the outcome."))
    except Exception as exc:  # a figure must not lose the table
        parts.append(f"<p class='absent'>figure failed: {esc(type(exc).__name__)}: {esc(exc)}</p>")
    parts.append(table(header, body, digits=4))
    parts.append(f"<p>{esc(explain(rows))}</p>")
    return "\n".join(parts)


def study_effects(study: dict) -> str:
    """The section of a Fig. 18b study (``study.json``): one per panel and variant."""
    groups: dict[str, list[tuple[int, dict]]] = {}
    for job in study.get("jobs") or []:
        params: dict[str, Any] = job.get("params") or {}
        if "block_size" in params and isinstance(job.get("summary"), dict):
            key = f"{params.get('panel', '')} {params.get('variant', '')}".strip()
            groups.setdefault(key, []).append((int(params["block_size"]), job["summary"]))
    if not groups:
        return ""
    return "<h4>Block size: memory effect and time effect</h4>" + "\n".join(
        effects_section(points, name) for name, points in groups.items())


def sweep_effects(jobs: list) -> str:
    """The section of a block-size sweep (``pagebench.reports.sweep.Job`` list): one per paged system."""
    groups: dict[str, list[tuple[int, dict]]] = {}
    for job in jobs:
        others = "".join(f", {k}={v}" for k, v in job.params.items() if k != "block_size")
        for name, summary in ((job.results or {}).get("systems") or {}).items():
            allocator = summary.get("allocator") or {}
            if allocator.get("kind") == "paged" and allocator.get("block_size"):
                groups.setdefault(name + others, []).append((int(allocator["block_size"]), summary))
    if not groups:
        return ""
    return "<h2 id='block-size-effects'>Block size: memory effect and time effect</h2>" + "\n".join(
        effects_section(points, f"system {name}") for name, points in groups.items())
