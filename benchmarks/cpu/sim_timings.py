"""Wall time of the simulator on the issue's trace replays, through the real CLI.

Runs ``python -m harness`` on the Azure 2023 conversation trace (the four default
systems, ``jobs=1`` and ``jobs=auto``) and on the Mooncake conversation trace (paged,
prefix caching on), and reads each run's ``run_info.json``: the per-system simulation
time (the engine loop with the full per-step memory accounting) and the run's total
(systems plus writing their tables; loading the trace excluded; no report is drawn:
``report=false``, as the figures never included it).
With ``--rounds N`` every run is repeated N times, the runs of a round one after the
other, and the figures are medians (each run's figure is kept beside them): this shared
machine drifts by 10-20% between runs.

    python benchmarks/cpu/sim_timings.py --traces ../shared/traces --rounds 3 --out benchmarks/cpu/sim-DATE.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RUNS = {
    "azure_conv_jobs1": ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
                         ["workload=azure_conv", "jobs=1"]),
    "azure_conv_jobs_auto": ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
                             ["workload=azure_conv", "jobs=auto"]),
    "mooncake_conversation_paged": ("mooncake_fast25_conversation/conversation_trace.jsonl",
                                    ["workload=mooncake", "systems=[paged]"]),
}


def run_once(trace: Path, overrides: list[str]) -> dict:
    """One CLI run in a scratch directory; its timings and step counts."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "harness", *overrides, f"workload.path={trace}",
               "progress=false", "report=false", f"hydra.run.dir={out}"]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        info = json.loads((Path(out) / "run_info.json").read_text())
        results = json.loads((Path(out) / "results.json").read_text())
    systems = {name: {"wall_time_s": entry["wall_time_s"],
                      "steps": results["systems"][name]["steps"]}
               for name, entry in info["systems"].items()}
    return {"command": "python -m harness " + " ".join(overrides) + f" workload.path={trace}",
            "jobs": info.get("jobs"), "total_wall_time_s": info["wall_time_s"],
            "requests": results["workload"].get("num_requests"), "systems": systems}


def medians(runs: list[dict]) -> dict:
    """``run_once``'s figures over repeated runs: medians, and every run's value."""
    walls = [run["total_wall_time_s"] for run in runs]
    systems = {}
    for name, first in runs[0]["systems"].items():
        times = [run["systems"][name]["wall_time_s"] for run in runs]
        systems[name] = {"wall_time_s": statistics.median(times), "wall_time_s_runs": times,
                         "steps": first["steps"]}
    return {**runs[0], "rounds": len(runs), "total_wall_time_s": statistics.median(walls),
            "total_wall_time_s_runs": walls, "systems": systems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--out", type=Path, help="write the JSON here (default: print it)")
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="a subset of the runs")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every run; report medians")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    figures = {"machine": {"date_utc": dt.datetime.now(dt.timezone.utc).date().isoformat(),
                           "cpus": os.cpu_count(), "platform": platform.platform(),
                           "python": platform.python_version()}}
    traces = {}
    for name in args.only or RUNS:
        trace = (args.traces / RUNS[name][0]).resolve()
        if trace.exists():
            traces[name] = trace
        else:
            print(f"skip {name}: {trace} not found", file=sys.stderr)
    runs: dict[str, list[dict]] = {name: [] for name in traces}
    for round_index in range(args.rounds):
        for name, trace in traces.items():
            runs[name].append(run_once(trace, RUNS[name][1]))
            print(f"round {round_index + 1}, {name}: {json.dumps(runs[name][-1])}", file=sys.stderr)
    for name, done in runs.items():
        figures[name] = medians(done)
    text = json.dumps(figures, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
