"""Wall time of the simulator on the issue's trace replays, through the real CLI; with
``--ref COMMIT`` beside other commits, system by system.

Runs ``python -m harness`` on the Azure 2023 conversation trace (the four default
systems, ``jobs=1`` and ``jobs=auto``) and on the Mooncake conversation trace (paged,
prefix caching on), and reads each run's ``run_info.json``: the per-system simulation
time (the engine loop with the full per-step memory accounting) and the run's total
(systems plus writing their tables; loading the trace excluded; no report is drawn:
``report=false``, as the figures never included it). The run's own overhead is the total
minus its systems: building the step and request tables, the phase columns, writing the
CSVs and results.json.
With ``--rounds N`` every run is repeated N times, the runs of a round one after the
other, and the figures are medians (each run's figure is kept beside them): this shared
machine drifts by 10-20% between runs.

    python benchmarks/cpu/sim_timings.py --traces ../shared/traces --rounds 3 --out benchmarks/cpu/sim-DATE.json

Comparing commits (``--ref aa919cf --ref b8db7de``): each reference is checked out into a
detached worktree (``--worktrees``, default ``/tmp/pagebench-ref-<sha>``) and run from it,
with its own import layout: a commit from before the regroup (top-level ``allocators``,
``kernels``, ``reports`` packages) runs with its tree on ``PYTHONPATH``; a later one gets a
``pagebench`` namespace mapped to its folders. HEAD is this checkout (uncommitted changes
included). Every round runs HEAD and each reference once, in an order that rotates from
round to round; the ratios HEAD / reference are taken inside each round (same load) and
reported as medians, for every system, for the overhead and for the whole run. The
brief's rule, new work slows no default system by more than 10%, is checked on all of
them: a ratio above ``--max-ratio`` (1.10) prints a FAIL line and the exit status is 1.

    python benchmarks/cpu/sim_timings.py --ref aa919cf --rounds 5 --only azure_conv_jobs1
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
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
LIBRARIES = ("allocators", "kernels", "reports")  # pagebench.<name> since the regroup (8c73edd)
CHECKOUT = "checkout"  # this tree (HEAD with any uncommitted change), beside the references
OVERHEAD = "overhead"  # the run's total minus its systems: tables, phase columns, results
TOTAL = "total"


class Tree:
    """A source tree to run ``python -m harness`` from: this checkout or a reference commit."""

    def __init__(self, label: str, root: Path, shim_dir: Path | None = None) -> None:
        self.label, self.root = label, root
        self.old_layout = (root / "allocators" / "__init__.py").is_file()
        self.shim = None
        if not self.old_layout:  # map pagebench.<library> to this tree's folders
            self.shim = (shim_dir or root / ".pbns") / "pagebench"
            self.shim.mkdir(parents=True, exist_ok=True)
            for name in LIBRARIES:
                link = self.shim / name
                if not link.is_symlink() or link.resolve() != (root / name).resolve():
                    link.unlink(missing_ok=True)
                    link.symlink_to(root / name, target_is_directory=True)

    def env(self) -> dict[str, str]:
        """The environment that makes its imports resolve to this tree only."""
        paths = [str(self.root)] if self.old_layout else [str(self.shim.parent), str(self.root)]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def checkout_tree() -> Tree:
    """This checkout, its pagebench namespace mapped outside it (no stray folder in the tree)."""
    tag = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    return Tree(CHECKOUT, ROOT, Path(tempfile.gettempdir()) / f"pagebench-checkout-{tag}-pbns")


def reference_tree(ref: str, worktrees: Path) -> Tree:
    """A detached worktree of ``ref`` (made once, reused while it is at that commit)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         check=True, capture_output=True, text=True).stdout.strip()
    path = worktrees / f"pagebench-ref-{sha[:12]}"
    if not (path / ".git").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), sha],
                       check=True, capture_output=True)
    shim = Path(tempfile.gettempdir()) / f"pagebench-ref-{sha[:12]}-pbns"
    return Tree(ref, path, shim)


def run_once(trace: Path, overrides: list[str], tree: Tree | None = None,
             scratch: Path | None = None) -> dict:
    """One CLI run in a scratch directory (under ``scratch``, default the system's temporary
    directory); its timings and step counts."""
    tree = tree or checkout_tree()
    with tempfile.TemporaryDirectory(dir=scratch) as out:
        cmd = [sys.executable, "-m", "harness", *overrides, f"workload.path={trace}",
               "progress=false", "report=false", f"hydra.run.dir={out}"]
        subprocess.run(cmd, cwd=tree.root, env=tree.env(), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
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


def parts(run: dict) -> dict[str, float]:
    """A run's seconds by part: each system, the overhead (total minus the systems; serial
    runs only, ``jobs=1``) and the total."""
    figures = {name: s["wall_time_s"] for name, s in run["systems"].items()}
    if run.get("jobs") == 1:
        figures[OVERHEAD] = round(run["total_wall_time_s"] - sum(figures.values()), 3)
    figures[TOTAL] = run["total_wall_time_s"]
    return figures


def compare(rounds: list[dict[str, dict]], refs: list[str], max_ratio: float) -> dict:
    """Per reference and part: each round's HEAD / reference ratio, their median, the
    medians of the seconds, and whether the median ratio keeps within ``max_ratio``."""
    table = {}
    for ref in refs:
        rows = {}
        for part in parts(rounds[0][CHECKOUT]):
            head = [parts(r[CHECKOUT])[part] for r in rounds]
            other = [parts(r[ref]).get(part) for r in rounds]
            if None in other:  # a system the reference does not run
                continue
            ratios = [h / o if o > 0 else float("inf") for h, o in zip(head, other)]
            ratio = statistics.median(ratios)
            rows[part] = {"head_s": statistics.median(head), "ref_s": statistics.median(other),
                          "ratio": round(ratio, 4), "ratio_rounds": [round(x, 4) for x in ratios],
                          "ok": ratio <= max_ratio}
        table[ref] = rows
    return table


def print_comparison(table: dict, max_ratio: float, out=sys.stdout) -> bool:
    """The ratios as a table, and a FAIL line for each part above ``max_ratio``; True
    when every part keeps within it."""
    ok = True
    for ref, rows in table.items():
        print(f"\nHEAD vs {ref} (median of per-round ratios; < 1 = HEAD faster)", file=out)
        print(f"{'part':>10} {'HEAD s':>9} {ref[:12] + ' s':>15} {'HEAD/ref':>9} {'speed-up':>9}",
              file=out)
        for part, row in rows.items():
            speedup = 1 / row["ratio"] if row["ratio"] else float("inf")
            print(f"{part:>10} {row['head_s']:9.3f} {row['ref_s']:15.3f} {row['ratio']:9.3f} "
                  f"{speedup:8.2f}x", file=out)
        for part, row in rows.items():
            if not row["ok"]:
                ok = False
                print(f"FAIL: {part} is {row['ratio']:.3f}x {ref} (more than the {max_ratio:.2f}x "
                      f"the 10% rule allows)", file=out)
    if ok:
        print(f"\nOK: every part within {max_ratio:.2f}x of each reference", file=out)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--out", type=Path, help="write the JSON here (default: print it)")
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="a subset of the runs")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every run; report medians")
    parser.add_argument("--ref", action="append", default=[], metavar="COMMIT",
                        help="compare HEAD with this commit, part by part (repeatable)")
    parser.add_argument("--worktrees", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the references' worktrees go")
    parser.add_argument("--scratch", type=Path, default=None,
                        help="where the runs write their outputs (default: the system's "
                             "temporary directory); a RAM disk such as /dev/shm keeps the "
                             "disk's writeback out of the overhead figures")
    parser.add_argument("--max-ratio", type=float, default=1.10,
                        help="HEAD / reference above this fails (the brief's 10%% rule)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    figures = {"machine": {"date_utc": dt.datetime.now(dt.timezone.utc).date().isoformat(),
                           "cpus": os.cpu_count(), "platform": platform.platform(),
                           "python": platform.python_version(),
                           "scratch": str(args.scratch or tempfile.gettempdir())}}
    traces = {}
    for name in args.only or RUNS:
        trace = (args.traces / RUNS[name][0]).resolve()
        if trace.exists():
            traces[name] = trace
        else:
            print(f"skip {name}: {trace} not found", file=sys.stderr)
    trees = [checkout_tree()]
    trees += [reference_tree(ref, args.worktrees) for ref in args.ref]
    runs: dict[str, list[dict[str, dict]]] = {name: [] for name in traces}
    for round_index in range(args.rounds):
        for name, trace in traces.items():
            done = {}
            shift = round_index % len(trees)  # rotate who runs first
            for tree in trees[shift:] + trees[:shift]:
                done[tree.label] = run_once(trace, RUNS[name][1], tree, args.scratch)
                print(f"round {round_index + 1}, {name}, {tree.label}: {json.dumps(done[tree.label])}",
                      file=sys.stderr)
            runs[name].append(done)
    ok = True
    for name, rounds in runs.items():
        figures[name] = medians([r[CHECKOUT] for r in rounds])
        if args.ref:
            figures[name]["references"] = {ref: medians([r[ref] for r in rounds]) for ref in args.ref}
            figures[name]["comparison"] = compare(rounds, args.ref, args.max_ratio)
            print(f"\n== {name}: {args.rounds} interleaved rounds")
            ok &= print_comparison(figures[name]["comparison"], args.max_ratio)
    text = json.dumps(figures, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    elif not args.ref:
        print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
