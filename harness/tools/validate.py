"""Validate the simulator against a measured run: its exact config again, in the sim.

    python -m harness.tools.validate RUN_DIR [--kernel-profile NAME|PATH]
        [--host-profile NAME|PATH] [--kernel-results PATH] [--hardware NAME|PATH] [--out DIR]

RUN_DIR is a torch-executor run folder (``config_resolved.yaml``, ``results.json``,
``steps_<system>.csv``). Its resolved config runs again with ``engine.executor=sim`` and
the same workload, seed, systems and KV capacity (``results.json``'s ``capacity_slots``),
priced with the hardware profile of the current ``conf/hardware/<name>.yaml`` (or
``--hardware``) and the kernel / host profiles named here. Per system it reports
sim/measured req/s, output tok/s, mean batch, TTFT p50/p99, TPOT p50 and the mean decode
and prefill step, then each step's predicted duration against the measured one by phase
and by batch / context bucket (``harness.tools.validate_compare``). Written to OUT
(default RUN_DIR/validation): ``validate.json``, ``validate.md``, ``validate.html`` (the
section of ``pagebench.reports.validation_section``: tables and a predicted-vs-measured
scatter) and the sim run itself under ``sim/``. Bad input: a one-line error, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import CONF_DIR


def load_measured(run_dir: Path) -> tuple[dict, dict, dict]:
    """(resolved config, results.json, {system: steps DataFrame}) of a measured run."""
    import pandas as pd
    import yaml

    from harness.errors import InputError

    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: not a run directory")
    files = {name: run_dir / name for name in ("config_resolved.yaml", "results.json")}
    for name, path in files.items():
        if not path.is_file():
            raise InputError(f"{run_dir}: no {name} (a run folder of python -m harness has one)")
    try:
        config = yaml.safe_load(files["config_resolved.yaml"].read_text(encoding="utf-8"))
        results = json.loads(files["results.json"].read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise InputError(f"{run_dir}: unreadable run files: {str(exc).splitlines()[0]}") from None
    if not isinstance(config, dict) or not isinstance(results, dict) or not results.get("systems"):
        raise InputError(f"{run_dir}: config_resolved.yaml or results.json holds no run")
    if results.get("executor") != "torch":
        raise InputError(f"{run_dir}: executor={results.get('executor')!r}; validate compares the sim "
                         "with a measured (engine.executor=torch) run")
    steps = {}
    for name in results["systems"]:
        path = run_dir / f"steps_{name}.csv"
        if not path.is_file():
            raise InputError(f"{path}: missing (the measured steps of system {name})")
        steps[name] = pd.read_csv(path)
    return config, results, steps


def hardware_node(name_or_path: str, recorded: dict) -> dict:
    """The hardware profile as a config node: a path, a conf/hardware name, or (when the
    name is not in conf/hardware) the run's recorded profile."""
    import yaml

    from harness.errors import InputError

    path = Path(name_or_path)
    if not path.suffix:
        path = CONF_DIR / "hardware" / f"{name_or_path}.yaml"
    if not path.is_file():
        if name_or_path == recorded.get("name"):
            return recorded
        raise InputError(f"--hardware: no {path}")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def sim_config(config: dict, results: dict, args: argparse.Namespace) -> dict:
    """The measured run's resolved config as a sim run (see the module docstring)."""
    import copy

    cfg = copy.deepcopy(config)
    cfg["hardware"] = hardware_node(args.hardware or config["hardware"]["name"], config["hardware"])
    engine = cfg["engine"]
    engine.update(executor="sim", kv_capacity_slots=int(results["capacity_slots"]), device="cpu",
                  wall_time_limit_s=None)
    cost = engine.setdefault("cost", {})
    cost["model"] = "operator"
    for key in ("kernel_profile", "host_profile", "kernel_results"):
        value = getattr(args, key)
        if value is not None:
            cost[key] = value
    if args.host_profile is not None:  # named here: it wins over the hardware's measured one
        cfg["hardware"]["host_profile"] = None
    cfg.update(report=False, progress=False, jobs=1)
    return cfg


def validate(run_dir: Path, out: Path, args: argparse.Namespace) -> dict:
    """Run the sim on the measured run's config; the comparison (also written to ``out``)."""
    import pandas as pd
    from omegaconf import OmegaConf

    from harness.run.serve import run_serving
    from harness.metrics.slow_steps import flag_table
    from harness.tools.validate_compare import (compare_figures, compare_steps, error_pct, paired,
                                                system_figures)

    config, results, measured_steps = load_measured(run_dir)
    cfg = sim_config(config, results, args)
    sim_dir = out / "sim"
    sim_dir.mkdir(parents=True, exist_ok=True)
    predicted = run_serving(OmegaConf.create(cfg), sim_dir)
    systems = {}
    for name, entry in results["systems"].items():
        sim_entry = predicted["systems"].get(name)
        if sim_entry is None:
            continue
        sim_steps = pd.read_csv(sim_dir / f"steps_{name}.csv")
        measured = measured_steps[name]
        # the mean step times over the same steps: a measured run cut by its wall limit
        # is compared with the sim's steps of the same prefix
        same = sim_steps.iloc[:len(measured)] if paired(sim_steps, measured) else sim_steps
        figures = compare_figures(system_figures(sim_entry, same), system_figures(entry, measured))
        complete = bool(entry.get("complete", True))
        if not complete:  # a run cut by its wall limit: its run figures cover a prefix only
            for key in ("requests_per_s", "ttft_p50_s"):
                figures[key]["within_target"] = None
        slow = flag_table(measured)
        excess = sum(row["seconds"] - row["peers_median_s"] for row in slow)
        makespan = _makespan(entry)
        if slow and complete and makespan and makespan > excess:
            # what req/s would have been without the slow steps' excess (offline: all
            # requests arrive at 0, so req/s = requests / makespan)
            rate = figures["requests_per_s"]["measured"] * makespan / (makespan - excess)
            figures["requests_per_s_without_slow_steps"] = {
                "measured": round(rate, 6), "predicted": figures["requests_per_s"]["predicted"],
                "error_pct": error_pct(figures["requests_per_s"]["predicted"], rate),
                "target_pct": None, "within_target": None}
        systems[name] = {"measured_complete": complete,
                         "measured_slow_steps": slow, "slow_steps_excess_s": round(excess, 4),
                         "figures": figures,
                         "steps": compare_steps(sim_steps, measured_steps[name])}
    cost = (next(iter(predicted["systems"].values()), {}) or {}).get("cost_model") or {}
    return {"run_dir": str(run_dir), "workload": results["workload"].get("name"),
            "model": results["model"].get("name"), "hardware": cfg["hardware"].get("name"),
            "capacity_slots": results["capacity_slots"],
            "profiles": {"kernel_profile": cost.get("kernel_profile"),
                         "host_profile": cost.get("host_profile"),
                         "kernel_results": cfg["engine"]["cost"].get("kernel_results"),
                         "cost_model": cfg["engine"]["cost"]["model"]},
            "sim_run": str(sim_dir), "systems": systems}


def _makespan(entry: dict) -> float | None:
    value = (entry.get("throughput") or {}).get("makespan_s")
    return float(value) if isinstance(value, (int, float)) else None


def main(argv: list[str] | None = None) -> int:
    from harness.errors import PagebenchError
    from harness.fileio import atomic_write_text, write_json
    from pagebench.reports.validation_section import console_table, markdown, render_validation

    parser = argparse.ArgumentParser(prog="python -m harness.tools.validate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a measured (engine.executor=torch) run folder")
    parser.add_argument("--kernel-profile", default=None,
                        help="conf/kernel_profile NAME or a YAML path (default: the hardware's)")
    parser.add_argument("--host-profile", default=None,
                        help="conf/host_profile NAME or a YAML path (default: the hardware's)")
    parser.add_argument("--kernel-results", default=None,
                        help="kernel_results.json a 'source: kernel_results' profile reads")
    parser.add_argument("--hardware", default=None,
                        help="conf/hardware NAME or a YAML path (default: the run's hardware name, "
                             "as conf/hardware has it now)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default RUN_DIR/validation)")
    args = parser.parse_args(argv)
    out = args.out or args.run_dir / "validation"
    try:
        report = validate(args.run_dir, out, args)
    except PagebenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_json(out / "validate.json", report)
    atomic_write_text(out / "validate.md", markdown(report))
    render_validation(report, out / "validate.html")
    print(console_table(report))
    print(f"wrote {out / 'validate.json'}, validate.md, validate.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
