"""Wall time of the simulator on the issue's trace replays, through the real CLI.

Runs ``python -m harness`` on the Azure 2023 conversation trace (the four default
systems, ``jobs=1`` and ``jobs=auto``) and on the Mooncake conversation trace (paged,
prefix caching on), and reads each run's ``run_info.json``: the per-system simulation
time (the engine loop with the full per-step memory accounting) and the run's total
(systems plus writing their tables; loading the trace and the report excluded).

    python benchmarks/cpu/sim_timings.py --traces ../shared/traces --out benchmarks/cpu/sim-DATE.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
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
               "progress=false", f"hydra.run.dir={out}"]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        info = json.loads((Path(out) / "run_info.json").read_text())
        results = json.loads((Path(out) / "results.json").read_text())
    systems = {name: {"wall_time_s": entry["wall_time_s"],
                      "steps": results["systems"][name]["steps"]}
               for name, entry in info["systems"].items()}
    return {"command": "python -m harness " + " ".join(overrides) + f" workload.path={trace}",
            "jobs": info.get("jobs"), "total_wall_time_s": info["wall_time_s"],
            "requests": results["workload"].get("num_requests"), "systems": systems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--out", type=Path, help="write the JSON here (default: print it)")
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="a subset of the runs")
    args = parser.parse_args(argv)
    figures = {"machine": {"date_utc": dt.datetime.now(dt.timezone.utc).date().isoformat(),
                           "cpus": os.cpu_count(), "platform": platform.platform(),
                           "python": platform.python_version()}}
    for name in args.only or RUNS:
        relative, overrides = RUNS[name]
        trace = (args.traces / relative).resolve()
        if not trace.exists():
            print(f"skip {name}: {trace} not found", file=sys.stderr)
            continue
        figures[name] = run_once(trace, overrides)
        print(f"{name}: {json.dumps(figures[name])}", file=sys.stderr)
    text = json.dumps(figures, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
