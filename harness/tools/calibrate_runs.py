"""Fit the operator cost model's measured defaults for a GPU from committed measurements.

    python -m harness.tools.calibrate_runs RUN_DIR --system paged --hostcost HOSTCOST.json
        --kernel-results KERNEL_RESULTS.json [--kernel-profile NAME|PATH] [--json OUT]

Three figures, each from its own measurement:

- ``bandwidth_efficiency`` (the linear layers' weight read, decode): the kernel
  benchmark's ``linear_roofline_ms / linear_ms`` (one layer's QKV, O and MLP matmuls at
  batch 1-64, CUDA events) for the run's model, median over its rows, times the copy
  bandwidth it was measured against over the spec bandwidth (the cost model's reference).
  Nothing of RUN_DIR is used.
- the host profile's ``prepare_inputs`` component: the torch executor's host-side block
  table and input preparation, ``ms_per_step`` of hostcost.json's rows (``mode`` full, or
  resident when the run kept block tables on the device) as ``per_step + per_seq * batch``
  by least squares. Nothing of RUN_DIR is used.
- ``compute_efficiency`` (prefill GEMMs and attention) and the host's per-step rest
  (sampling, the host sync, graph replay launch): fitted to RUN_DIR's ``--system`` steps
  (slow steps left out, ``harness.metrics.slow_steps``) by least squares in relative error,
  the other terms priced by the sim on the same schedule (the kernel profile's decode
  attention, the bandwidth efficiency above). Only that system of that run is fitted:
  validate on the others (``python -m harness.tools.validate``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np


def linear_bandwidth_efficiency(kernel_results: dict, model_name: str, spec_gbps: float) -> dict:
    """The linear layers' bandwidth efficiency against ``spec_gbps`` from a kernel benchmark."""
    from harness.errors import InputError

    rows = [r for r in kernel_results.get("rows", []) if r.get("head_config") == model_name
            and r.get("linear_ms") and r.get("linear_roofline_ms")]
    if not rows:
        raise InputError(f"kernel results: no row of head config {model_name} with linear_ms")
    per_batch = {}
    for r in rows:  # one figure per batch (the linear time does not depend on context or block)
        per_batch.setdefault(int(r["batch"]), r["linear_roofline_ms"] / r["linear_ms"])
    of_copy = float(np.median(list(per_batch.values())))
    copy_gbps = float(kernel_results["copy_bandwidth_GBps"])
    return {"of_copy_bandwidth": round(of_copy, 4), "copy_bandwidth_gbps": round(copy_gbps, 1),
            "batches": sorted(per_batch), "efficiency": round(of_copy * copy_gbps / spec_gbps, 4)}


def prepare_inputs_cost(hostcost: dict, resident: bool) -> dict:
    """``per_step_s + per_seq_s * batch`` fitted to hostcost.json's rows of one mode."""
    from harness.errors import InputError

    mode = "resident" if resident else "full"
    rows = [r for r in hostcost.get("rows", []) if r.get("mode") == mode]
    if len(rows) < 2:
        raise InputError(f"hostcost: fewer than two rows of mode {mode}")
    batch = np.asarray([r["batch_size"] for r in rows], dtype=np.float64)
    ms = np.asarray([r["ms_per_step"] for r in rows], dtype=np.float64)
    per_seq, per_step = np.polyfit(batch, ms, 1)
    return {"mode": mode, "batches": [int(b) for b in batch], "per_step_s": round(float(per_step) / 1e3, 7),
            "per_seq_s": round(float(per_seq) / 1e3, 8)}


def step_terms(run_dir: Path, system: str, kernel_profile: str, kernel_results: str,
               bandwidth_eff: float, out: Path):
    """The measured steps of ``system`` and the sim's phases for the same schedule at
    compute efficiency 1 and no host work (so the compute terms scale as 1/efficiency)."""
    import pandas as pd
    from omegaconf import OmegaConf

    from harness.errors import InputError
    from harness.run.serve import run_serving
    from harness.tools.validate import load_measured, sim_config
    from harness.tools.validate_compare import paired

    config, results, steps = load_measured(run_dir)
    if system not in steps:
        raise InputError(f"--system: {run_dir} has no system {system} (it has {', '.join(steps)})")
    args = SimpleNamespace(hardware=None, kernel_profile=kernel_profile, host_profile="none",
                           kernel_results=kernel_results)
    cfg = sim_config(config, results, args)
    cfg["hardware"].update(compute_efficiency=1.0, bandwidth_efficiency=bandwidth_eff, host_profile=None)
    cfg["systems"] = [system]
    run_serving(OmegaConf.create(cfg), out)
    sim = pd.read_csv(out / f"steps_{system}.csv")
    if not paired(sim, steps[system]):
        raise InputError(f"{run_dir}: the sim did not replay {system}'s schedule; cannot pair its steps")
    n = min(len(sim), len(steps[system]))
    return steps[system].iloc[:n].reset_index(drop=True), sim.iloc[:n].reset_index(drop=True), config


def fit_compute_and_host(measured, sim, token_s: float, weights_s: float, prep: dict) -> dict:
    """compute_efficiency and the host's per-step rest, least squares in relative error."""
    from scipy.optimize import least_squares

    from harness.metrics.slow_steps import flag_table

    slow = {row["step"] for row in flag_table(measured)}
    keep = np.asarray([i not in slow for i in range(len(measured))])
    tokens = measured["num_batched_tokens"].to_numpy(np.float64)[keep]  # [n]
    seqs = measured["num_seqs"].to_numpy(np.float64)[keep]
    y = measured["duration_s"].to_numpy(np.float64)[keep]
    pre = sim["attention_prefill_s"].to_numpy(np.float64)[keep]  # at compute efficiency 1
    fixed = (sim["attention_decode_s"] + sim["kv_write_s"] + sim["copy_s"] + sim["swap_s"]
             ).to_numpy(np.float64)[keep] + prep["per_step_s"] + prep["per_seq_s"] * seqs

    def model(p):
        ce, rest, rest_seq = p
        return np.maximum(tokens * token_s / ce, weights_s) + pre / ce + fixed + rest + rest_seq * seqs

    fit = least_squares(lambda p: (model(p) - y) / y, x0=[0.5, 1e-3, 1e-5],
                        bounds=([1e-3, 0.0, 0.0], [1.0, 1.0, 1.0]))
    ce, rest, rest_seq = (float(v) for v in fit.x)
    err = (model(fit.x) - y) / y
    prefill = measured["num_prefill_tokens"].to_numpy()[keep] > 0
    summary = lambda e: ({"count": int(e.size), "median_abs_pct": round(float(np.median(np.abs(e)) * 100), 2)}
                         if e.size else {"count": 0})
    return {"compute_efficiency": round(ce, 4), "rest_per_step_s": round(rest, 6),
            "rest_per_seq_s": round(rest_seq, 8),
            "fitted_steps": int(keep.sum()), "slow_steps_left_out": sorted(slow),
            "error": summary(err), "prefill_error": summary(err[prefill]),
            "decode_error": summary(err[~prefill])}


def kernel_profile_yaml(kernel_results: Path, name: str, cited: str) -> str:
    """A kernel profile YAML holding the points of ``kernel_results`` (the same efficiencies
    ``source: kernel_results`` reads, as a table), so that it travels with conf/."""
    import yaml

    from harness.engine.cost_profiles import _points_from_kernel_results

    points = []
    for p in _points_from_kernel_results(kernel_results):
        point = {"layout": p.layout}
        point.update({k: getattr(p, k) for k in ("block_size", "batch", "context_len", "gqa_group",
                                                  "head_dim", "dtype") if getattr(p, k) is not None})
        point["efficiency"] = p.efficiency
        points.append(point)
    header = [f"# {name}: the rows of {cited} as a table (written by",
              f"#   python -m harness.tools.calibrate_runs ... --kernel-profile-out conf/kernel_profile/{name}.yaml).",
              "# efficiency = paged_frac_copy_bw (or contiguous_frac_copy_bw): the achieved KV bandwidth",
              "# over the copy bandwidth measured in the same run; bilinear in (batch, context) between",
              "# points; the same numbers engine.cost.kernel_profile=measured reads from that file.",
              "# A later (e.g. graph-timed) profile is selected by file the same way:",
              "#   engine.cost.kernel_profile=PATH.yaml, or kernel_profile=measured kernel_results=PATH.json",
              "# A head config it did not measure takes the nearest measured one (GQA group, then head",
              "# dim, on a log2 scale; bfloat16 as float16, the same bytes); results.json's cost_model",
              "# says which stood in. A hardware profile's default must run every model preset."]
    body = yaml.safe_dump({"name": name, "head_configs": "nearest", "points": points}, sort_keys=False,
                          default_flow_style=None, width=120)
    return "\n".join(header) + "\n" + body


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from harness.config.specs import CostSpec, ModelSpec, build_spec
    from harness.engine.cost_operator import OperatorCostModel
    from harness.errors import InputError, PagebenchError
    from harness.fileio import read_json
    from harness.tools.calibrate import load_spec
    from harness.config.specs import HardwareSpec

    parser = argparse.ArgumentParser(prog="python -m harness.tools.calibrate_runs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--system", default="paged", help="the one system of RUN_DIR fitted")
    parser.add_argument("--hostcost", required=True, help="hostcost.json (python -m harness.tools.hostcost)")
    parser.add_argument("--kernel-results", required=True, help="kernel_results.json of the same GPU")
    parser.add_argument("--kernel-profile", default="measured",
                        help="decode attention's profile while fitting (default measured: --kernel-results)")
    parser.add_argument("--json", type=Path, default=None, help="also write the fit here")
    parser.add_argument("--kernel-profile-out", type=Path, default=None,
                        help="also write --kernel-results as a kernel profile YAML (a points table) here")
    args = parser.parse_args(argv)
    try:
        kernel = read_json(Path(args.kernel_results), "no such file")
        hostcost = read_json(Path(args.hostcost), "no such file")
        config_path = args.run_dir / "config_resolved.yaml"
        if not config_path.is_file():
            raise InputError(f"{args.run_dir}: no config_resolved.yaml")
        import yaml

        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
        model = build_spec(ModelSpec, config["model"], "model")
        hardware = load_spec(HardwareSpec, "hardware", config["hardware"]["name"], "hardware")
        linear = linear_bandwidth_efficiency(kernel, model.name, hardware.hbm_bandwidth_gbps)
        prep = prepare_inputs_cost(hostcost, bool(config["engine"].get("block_tables_on_device")))
        with tempfile.TemporaryDirectory() as tmp:
            measured, sim, _ = step_terms(args.run_dir, args.system, args.kernel_profile,
                                          args.kernel_results, linear["efficiency"], Path(tmp))
        unit = OperatorCostModel(model, hardware, CostSpec(compute_efficiency=1.0,
                                                           bandwidth_efficiency=linear["efficiency"],
                                                           host_profile="none"), "paged", 16)
        fit = fit_compute_and_host(measured, sim, unit.token_s, unit.weights_s, prep)
    except PagebenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = {"run_dir": str(args.run_dir), "system": args.system, "kernel_profile": args.kernel_profile,
              "linear_bandwidth": linear, "prepare_inputs": prep, "fit": fit}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    if args.kernel_profile_out:
        args.kernel_profile_out.write_text(kernel_profile_yaml(
            Path(args.kernel_results), args.kernel_profile_out.stem, args.kernel_results), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
