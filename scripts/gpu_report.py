"""Summaries of a GPU check (scripts/gpu_check.sh, scripts/gpu_engine.sh); plain Python, no GPU.

    python scripts/gpu_report.py summary WORK NAME TITLE [--device D --commit C --budget S --elapsed S --rehearsal 0|1]
        WORK/NAME.json and WORK/NAME.md: date, device, commit, budget, the stage table
        (WORK/stages.tsv), the kernel targets and table head (WORK/kernels/kernel_results.json)
        and the engine summary (WORK/engine.md)
    python scripts/gpu_report.py figures KERNELS_DIR     the three kernel PNGs from kernel_results.json
    python scripts/gpu_report.py engine-md ENGINE_DIR    engine.md (stdout): the serving runs, calibration, host cost
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path


def _stages(work: Path) -> list[dict]:
    path = work / "stages.tsv"
    rows = [line.split("\t") for line in path.read_text().splitlines()] if path.is_file() else []
    return [{"stage": r[0], "rc": r[1], "limit_s": int(r[2]), "time_s": int(r[3])} for r in rows if len(r) == 4]


def summary(args) -> None:
    work = Path(args.work)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    stages = _stages(work)
    doc = {"name": args.name, "date": date, "device": args.device or "no CUDA device", "commit": args.commit,
           "rehearsal": args.rehearsal == "1", "budget_s": args.budget, "elapsed_s": args.elapsed, "stages": stages}
    kernels = work / "kernels" / "kernel_results.json"
    results = json.loads(kernels.read_text()) if kernels.is_file() else None
    if results:
        doc["kernel_targets"] = results.get("targets")
        doc["kernel_points"] = {"measured": results.get("measured_points"), "truncated": results.get("truncated"),
                                "kernel_timing": results.get("kernel_timing")}
    (work / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# {args.title}{' -- rehearsal, no GPU' if doc['rehearsal'] else ''}", "",
             f"- date: {date}", f"- device: {doc['device']}", f"- commit: {args.commit}",
             f"- elapsed: {args.elapsed} s of a {args.budget} s budget", "",
             "| stage | rc | limit s | time s |", "|---|---|---|---|",
             *[f"| {s['stage']} | {s['rc']} | {s['limit_s']} | {s['time_s']} |" for s in stages], ""]
    if results:
        table = (work / "kernels" / "kernel_results.md").read_text().splitlines()
        lines += ["## Kernel benchmark", ""]
        lines += [line.replace("# ", "### ", 1) if line.startswith("# ") else line for line in table]
    engine = work / "engine.md"
    if engine.is_file():
        lines += [""] + [line.replace("# ", "## ", 1) if line.startswith("# ") else line
                         for line in engine.read_text().splitlines()]
    lines += ["", f"Everything else: {args.name}.tar.gz (the whole work folder: logs, run folders, point log)."]
    (work / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:10 + len(stages)]))


def figures(args) -> None:
    from pagebench.reports.kernel_figures import kernel_figures

    out = Path(args.dir)
    results = json.loads((out / "kernel_results.json").read_text())
    names = ["latency_vs_context", "bandwidth_vs_block_size", "paged_over_contiguous_vs_block_size"]
    for name, (fig, _caption) in zip(names, kernel_figures(results)):
        fig.savefig(out / f"{name}.png", dpi=120)
    print("targets:", json.dumps(results.get("targets"), indent=1))


def engine_md(args) -> None:
    out = Path(args.dir)
    print("# Real-engine run (torch executor)\n")
    for name in ("docqa", "sharegpt_like"):
        path = out / name / "results.json"
        if not path.is_file():
            print(f"\n## {name}: no results")
            continue
        r = json.loads(path.read_text())
        systems = r["systems"]
        digests = {s.get("output_digest") for s in systems.values()}
        print(f"\n## {name} ({r['workload'].get('num_requests', '?')} requests, capacity "
              f"{r['capacity_slots']} slots, complete={r['complete']})\n")
        print(f"same tokens on every system (output_digest): {len(digests) == 1}\n")
        print("| system | out tok/s | req/s | mean batch | max batch | token_states % | reserved % | "
              "preempt | decode step p50 ms | host prep % | J/token | mean W | complete |")
        print("|---" * 13 + "|")
        for n, s in systems.items():
            m, e = s["memory"], s.get("executor", {})
            print(f"| {n} | {s['throughput']['output_tokens_per_s']} | {s['throughput']['requests_per_s']} | "
                  f"{s['batch']['mean_seqs']} | {s['batch']['max_seqs']} | {m.get('token_states_pct')} | "
                  f"{m.get('reserved_pct')} | {s['preemptions']} | "
                  f"{e.get('decode_step_ms', {}).get('p50')} ({e.get('decode_path')}) | "
                  f"{e.get('host_prep_share_pct')} | {s.get('energy_per_token_j')} | "
                  f"{s.get('nvml', {}).get('mean_power_w')} | {s['complete']} |")
    cal = out / "calibration.json"
    if cal.is_file():
        c = json.loads(cal.read_text())
        print(f"\n## Calibration ({c['device']}, {c['train_steps']} fitted steps)\n")
        for key in ("held_back_error", "held_back_decode_error", "held_back_prefill_error", "train_error"):
            print(f"- {key}: {c.get(key)}")
        print(f"- coefficients: {c.get('coefficients')}")
    host = out / "hostcost.json"
    if host.is_file():
        from harness.tools.hostcost import markdown

        print("\n## CPU-side block-table cost\n")
        print(markdown(json.loads(host.read_text())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary")
    s.add_argument("work")
    s.add_argument("name")
    s.add_argument("title")
    for key in ("device", "commit", "budget", "elapsed", "rehearsal"):
        s.add_argument(f"--{key}", default="")
    sub.add_parser("figures").add_argument("dir")
    sub.add_parser("engine-md").add_argument("dir")
    args = parser.parse_args(argv)
    {"summary": summary, "figures": figures, "engine-md": engine_md}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
