"""Ratios of pagebench's manager to the peers, per round and their median.

    python3 benchmarks/peers/summarize.py RESULTS.jsonl [--json out.json] [--markdown out.md]

Input: the JSON lines of ``run_side_by_side.sh`` (each bench.py's objects, tagged with
``round``). For every (num_blocks, prefix_caching) it prints each peer's median
``ops_per_sec_wall``, the median over rounds of ours / peer (each ratio taken within one
round, i.e. side by side), and whether the targets of issue 7 hold. With caching off it
also checks that steps, preemptions and block counts equal vLLM's in every round.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
from collections import defaultdict

OURS = "pagebench"
TARGETS = {  # (prefix_caching, peer) -> minimum ratio ours / peer
    (False, "vllm"): 5.0,
    (True, "vllm"): 3.0,
    (True, "sglang"): 1.5,
}
SAME = ("steps", "preemptions", "admits", "decode_ops", "frees", "peak_used_blocks",
        "mean_used_blocks", "blocks_in_use_after_run")


def _peer(name: str) -> str:
    for short in (OURS, "vllm", "sglang"):
        if short in name:
            return short
    return name


def summarize(rows: list[dict]) -> dict:
    runs = defaultdict(dict)  # (blocks, caching) -> {(peer, round): row}
    for d in rows:
        runs[(d["num_blocks"], d["prefix_caching"])][(_peer(d["peer"]), d.get("round", 1))] = d
    out = []
    for (blocks, caching), got in sorted(runs.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        rounds = sorted({r for _, r in got})
        peers = sorted({p for p, _ in got})
        entry = {"num_blocks": blocks, "prefix_caching": caching, "rounds": len(rounds), "peers": {}}
        for p in peers:
            ops = [got[(p, r)]["ops_per_sec_wall"] for r in rounds if (p, r) in got]
            entry["peers"][p] = {
                "version": next((got[(p, r)].get("version") for r in rounds if (p, r) in got), None),
                "ops_per_sec_wall_median": round(statistics.median(ops), 1),
                "ops_per_sec_wall_rounds": ops,
                "prefix_hit_rate": got[(p, rounds[-1])].get("prefix_hit_rate") if (p, rounds[-1]) in got else None,
            }
        for p in peers:
            if p == OURS:
                continue
            ratios = [got[(OURS, r)]["ops_per_sec_wall"] / got[(p, r)]["ops_per_sec_wall"]
                      for r in rounds if (OURS, r) in got and (p, r) in got]
            if not ratios:
                continue
            med = statistics.median(ratios)
            target = TARGETS.get((caching, p))
            entry["peers"][p]["ours_over_peer_rounds"] = [round(x, 2) for x in ratios]
            entry["peers"][p]["ours_over_peer_median"] = round(med, 2)
            if target is not None:
                entry["peers"][p]["target"] = target
                entry["peers"][p]["target_met"] = med >= target
        if not caching and any(p == "vllm" for p in peers):
            mismatches = []
            for r in rounds:
                a, b = got.get((OURS, r)), got.get(("vllm", r))
                if a and b:
                    mismatches += [f"round {r} {k}: ours {a.get(k)} vllm {b.get(k)}"
                                   for k in SAME if a.get(k) != b.get(k)]
            entry["identical_to_vllm"] = not mismatches
            entry["mismatches"] = mismatches
        out.append(entry)
    return {"configs": out}


def machine() -> dict:
    """Where the summary was made (the runs are on the same machine, one after the other)."""
    model = None
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), None)
    except OSError:
        pass
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "platform": platform.platform(), "cpu": model or platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version()}


def markdown(summary: dict) -> str:
    m = summary.get("machine", {})
    head = (f"Measured {m.get('date_utc', '?')[:10]} on {m.get('cpus', '?')} CPUs ({m.get('cpu', '?')}), "
            f"{m.get('platform', '?')}; median of {max(e['rounds'] for e in summary['configs'])} "
            "side-by-side rounds, ratios taken within each round.\n\n")
    lines = ["| pool (blocks) | prefix cache | pagebench ops/s | vLLM ops/s | SGLang ops/s "
             "| pagebench / vLLM | pagebench / SGLang | same steps/preemptions/blocks as vLLM |",
             "|---|---|---|---|---|---|---|---|"]
    for e in summary["configs"]:
        p = e["peers"]

        def ops(name):
            return f"{p[name]['ops_per_sec_wall_median'] / 1e3:,.0f}K" if name in p else "n/a"

        def ratio(name):
            if name not in p or "ours_over_peer_median" not in p[name]:
                return "n/a"
            r = p[name]
            mark = "" if "target" not in r else (f" (>= {r['target']:g}: {'met' if r['target_met'] else 'NOT met'})")
            return f"{r['ours_over_peer_median']:.2f}x{mark}"
        same = {True: "yes", False: "NO"}.get(e.get("identical_to_vllm"), "n/a (caching on)")
        lines.append(f"| {e['num_blocks']} | {'on' if e['prefix_caching'] else 'off'} | {ops(OURS)} "
                     f"| {ops('vllm')} | {ops('sglang')} | {ratio('vllm')} | {ratio('sglang')} | {same} |")
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--markdown", help="write the markdown table here")
    a = ap.parse_args()
    rows = []
    for f in a.files:
        with open(f) as fh:
            rows += [json.loads(line) for line in fh if line.startswith("{")]
    summary = summarize(rows)
    summary["machine"] = machine()
    table = markdown(summary)
    print(table)
    for e in summary["configs"]:
        for m in e.get("mismatches", []):
            print("MISMATCH", e["num_blocks"], m)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({**summary, "runs": rows}, fh, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as fh:
            fh.write(table)


if __name__ == "__main__":
    main()
