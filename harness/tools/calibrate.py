"""Calibrate the simulator: fit step-cost coefficients to measured torch runs.

    python -m harness.tools.calibrate                          # CPU: tiny model, small grid
    python -m harness.tools.calibrate --model llama-2-13b --hardware h200   # on the GPU

For every (batch size, context length) of a grid, ``batch`` requests with
``context``-token prompts and ``--output-len`` outputs run offline through the real
engine (scheduler + paged manager + torch executor). Each executed step gives one sample:
the features the sim's cost model sees (tokens, attention pairs, cached KV slots read,
sequences, prefill chunks) and the measured step time. A non-negative least-squares fit
in relative error gives the coefficients of ``FittedCostSpec``; some grid points are held
back and never fitted, and the prediction error on their steps is reported (target:
median absolute error under 10% on the GPU).

The result is a hardware profile YAML (the base profile plus a ``fitted`` section) that
``hardware=<name>`` selects; the sim then uses the fitted step time for this model (and
the derived efficiencies for other models). On CPU the run is small and its timings are
CPU timings: it says so, and the profile is only good for this host.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

import harness
from harness.config.cli_args import (check_device, device_arg, non_negative_int, output_file, positive_int,
                              positive_ints)
from harness.config.specs import (EngineSpec, FittedCostSpec, HardwareSpec, ModelSpec, SystemSpec,
                            build_spec)

from harness.tools.calibrate_fit import (COEFFICIENTS, FEATURES, Sample, error_summary, fit_coefficients,
                                   predict, relative_errors)

CONF_DIR = harness.CONF_DIR
__all__ = ["COEFFICIENTS", "FEATURES", "Sample", "calibrate", "fit_coefficients", "main", "predict"]
CPU_GRID = dict(batch_sizes=(1, 4, 16), context_lens=(16, 64, 192), output_len=6)
GPU_GRID = dict(batch_sizes=(1, 8, 32, 96), context_lens=(128, 512, 1536), output_len=12)
WARMUP_OUTPUT_LEN = 3  # decode steps of a point's untimed warm-up pass


def load_spec(cls, group: str, name: str, where: str):
    """A config group entry (conf/<group>/<name>.yaml) as its typed spec."""
    from omegaconf import OmegaConf

    from harness.errors import ConfigError

    path = CONF_DIR / group / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
        raise ConfigError(f"--{where}: no {path}; known: {known}")
    return build_spec(cls, OmegaConf.load(path), where)


def measure_point(model: ModelSpec, engine: EngineSpec, batch_size: int, context_len: int,
                  output_len: int, *, block_size: int = 16, seed: int = 0,
                  layout: str = "paged") -> list[Sample]:
    """Run ``batch_size`` offline requests of ``context_len`` prompt tokens on the paged
    manager or (``layout="contiguous"``) the contiguous oracle; one sample per step."""
    from harness.engine.engine import run_engine
    from harness.engine.scheduler import Scheduler
    from harness.engine.torch_executor import TorchExecutor
    from harness.config.systems import build_manager
    from harness.workloads.request import Request

    rng = np.random.default_rng(seed * 7919 + batch_size * 104_729 + context_len)
    requests = []
    for i in range(batch_size):
        prompt = rng.integers(0, 1 << 29, context_len, dtype=np.int32)
        prompt.flags.writeable = False
        requests.append(Request(i, 0.0, prompt, output_len, name=f"calibrate/{i}"))
    system = layout_system(layout, block_size)
    max_model_len = context_len + output_len
    manager = build_manager(system, engine.kv_capacity_slots, model, engine, max_model_len)
    scheduler = Scheduler(manager, engine, seed=seed)
    # warm=False: calibrate runs an untimed pass of each point's own shapes instead
    executor = TorchExecutor(model, system, manager, engine, max_model_len=max_model_len, seed=seed,
                             warm=False)
    try:
        run = run_engine(tuple(requests), scheduler, executor, engine, max_model_len=max_model_len)
        if run.rejected:
            raise RuntimeError(f"grid point ({batch_size}, {context_len}) rejected requests: "
                               f"{run.rejected}")
        return [Sample((batch_size, context_len), s.num_tokens, float(s.attention_pairs),
                       s.kv_read_slots, s.num_seqs, s.num_prefill_chunks, s.duration_s)
                for s in executor.step_log]
    finally:
        executor.close()


def layout_system(layout: str, block_size: int) -> SystemSpec:
    """The system a layout is measured on: paged (``block_size``) or the contiguous oracle."""
    if layout == "paged":
        return SystemSpec(name="paged", kind="paged", block_size=block_size)
    return SystemSpec(name="oracle", kind="contiguous", policy="oracle")


def point_slots(model: ModelSpec, engine: EngineSpec, layout: str, block_size: int, batch: int,
                context: int, output_len: int) -> int:
    """KV slots ``batch`` sequences of ``context`` + ``output_len`` tokens take on the layout's
    manager: whole blocks (paged) or the arena's extent per reservation (the contiguous
    oracle's buddy arena rounds each one up to a power of two: 140 tokens take 256 slots)."""
    from harness.config.systems import build_manager

    final_len = context + output_len
    probe = build_manager(layout_system(layout, block_size), max(final_len, block_size) * 2,
                          model, replace(engine, swap_space_gib=0.0), final_len)
    per_sequence = probe.member_slots(context, final_len)  # paged: whole blocks of it
    return batch * -(-per_sequence // block_size) * block_size


def derived_efficiencies(model: ModelSpec, hardware: HardwareSpec, coef: np.ndarray) -> tuple:
    """Roofline efficiencies implied by the fit (for models other than the measured one)."""
    from harness.engine.sim_executor import RooflineCostModel
    from harness.config.specs import CostSpec

    unit = CostSpec(compute_efficiency=1.0, bandwidth_efficiency=1.0, step_overhead_s=0.0,
                    model="roofline")
    roof = RooflineCostModel(model, replace(hardware, fitted=None, fitted_contiguous=None), unit)
    per_token, per_kv = coef[1], coef[3]
    compute = roof.flops_per_token / (per_token * roof.peak_flops) if per_token > 0 else None
    bandwidth = roof.bytes_per_slot / (per_kv * roof.bandwidth) if per_kv > 0 else None
    clip = (lambda v: None if v is None else round(float(min(1.0, max(v, 1e-4))), 4))
    return clip(compute), clip(bandwidth)


def calibrate(model: ModelSpec, hardware: HardwareSpec, engine: EngineSpec, *,
              batch_sizes, context_lens, output_len: int, holdout_every: int = 3,
              block_size: int = 16, seed: int = 0, layout: str = "paged", log=print) -> dict:
    """Measure the grid on ``layout``'s system (paged, or the contiguous oracle), fit on
    the kept points (``harness.tools.calibrate_fit``: the linear layers' max included), evaluate
    on the held-back ones."""
    from harness.engine.torch_device import device_name, resolve_device, torch_kv_capacity_slots

    device = resolve_device(engine.device)
    max_len = max(context_lens) + output_len
    capacity = torch_kv_capacity_slots(model, hardware, engine, max_model_len=max_len, seed=seed)
    points = [(b, c) for b in sorted(batch_sizes) for c in sorted(context_lens)]
    need = {(b, c): point_slots(model, engine, layout, block_size, b, c, output_len) for b, c in points}
    fits = [p for p in points if need[p] <= capacity]
    if len(fits) < len(points):
        log(f"skipping {len(points) - len(fits)} grid points larger than the KV pool ({capacity} slots)")
    held = {p for i, p in enumerate(fits) if holdout_every and i % holdout_every == holdout_every // 2}
    log(f"calibrating {layout} {model.name} ({model.layers} layers, {model.dtype}) on {device_name(device)}: "
        f"{len(fits)} grid points, {len(held)} held back")
    samples: list[Sample] = []
    warmup_s = 0.0
    t0 = time.perf_counter()
    for b, c in fits:
        point_engine = _point_engine(engine, b, c, output_len, capacity, need[(b, c)], block_size)
        # untimed warm-up pass of the same shapes (the prefill of b x c tokens, decode at
        # batch b): kernels compiled and autotuned, caches primed before the timed pass
        started = time.perf_counter()
        measure_point(model, point_engine, b, c, min(output_len, WARMUP_OUTPUT_LEN),
                      block_size=block_size, seed=seed, layout=layout)
        warmup_s += time.perf_counter() - started
        got = measure_point(model, point_engine, b, c, output_len, block_size=block_size, seed=seed,
                            layout=layout)
        samples.extend(got)
        log(f"  batch {b:4d} context {c:5d}: {len(got)} steps, {sum(s.seconds for s in got):.3f} s"
            f"{'  (held back)' if (b, c) in held else ''}")
    log(f"  warm-up passes (untimed, one per point): {warmup_s:.2f} s")
    train = [s for s in samples if s.point not in held]
    test = [s for s in samples if s.point in held]
    coef = fit_coefficients(train, with_floor=True)
    compute_eff, bandwidth_eff = derived_efficiencies(model, hardware, coef)
    fitted = build_spec(FittedCostSpec, dict(
        model=model.name, num_layers=model.layers, dtype=model.dtype,
        linear_floor_s=float(coef[len(COEFFICIENTS)]),
        compute_efficiency=compute_eff, bandwidth_efficiency=bandwidth_eff,
        max_batch_size=max(b for b, _ in fits),
        # KV per sequence after its last decode step (prompt + output - 1)
        max_context_len=max(c for _, c in fits) + output_len - 1,
        **{name: float(v) for name, v in zip(COEFFICIENTS, coef)}), "fitted")
    per_point = []
    for p in fits:
        steps = [s for s in samples if s.point == p]
        measured = sum(s.seconds for s in steps)
        predicted = float(predict(coef, steps).sum())
        per_point.append({"batch_size": p[0], "context_len": p[1], "held_back": p in held,
                          "steps": len(steps), "measured_s": round(measured, 5),
                          "predicted_s": round(predicted, 5),
                          "error_pct": round(100 * (predicted - measured) / measured, 2)})
    decode = [s for s in test if s.num_prefill_chunks == 0]
    prefill = [s for s in test if s.num_prefill_chunks > 0]
    return {
        "device": device_name(device), "cpu_timings": device.type != "cuda", "layout": layout,
        "model": model.name, "layers": model.layers, "dtype": model.dtype,
        "grid": {"batch_sizes": sorted(batch_sizes), "context_lens": sorted(context_lens),
                 "output_len": output_len, "block_size": block_size},
        "measure_wall_s": round(time.perf_counter() - t0 - warmup_s, 2),
        "warmup_wall_s": round(warmup_s, 2),
        "train_steps": len(train), "held_back_steps": len(test),
        "coefficients": {name: float(v) for name, v in zip((*COEFFICIENTS, "linear_floor_s"), coef)},
        "fitted": asdict(fitted),
        "train_error": error_summary(relative_errors(coef, train)),
        "held_back_error": error_summary(relative_errors(coef, test)),
        "held_back_decode_error": error_summary(relative_errors(coef, decode)),
        "held_back_prefill_error": error_summary(relative_errors(coef, prefill)),
        "points": per_point,
    }


def _point_engine(engine: EngineSpec, batch: int, context: int, output_len: int, capacity: int,
                  need: int, block_size: int) -> EngineSpec:
    """The engine of one grid point: a pool of the point's ``need`` slots (its layout's
    reservations, ``point_slots``) plus four blocks, at most the device's ``capacity``."""
    return replace(engine, max_num_seqs=max(batch, 1),
                   max_num_batched_tokens=max(engine.max_num_batched_tokens, context),
                   kv_capacity_slots=min(capacity, need + 4 * block_size),
                   swap_space_gib=0.0, telemetry_interval_s=0, fast_forward=False,
                   executor="torch")


def _extrapolation_note(result: dict) -> str:
    """What the fit covers: runs with longer contexts or larger batches extrapolate."""
    grid = result["grid"]
    return (f"fitted on contexts up to {max(grid['context_lens'])} tokens and batches up to "
            f"{max(grid['batch_sizes'])}; predictions beyond them extrapolate (widen "
            "--context-lens / --batch-sizes to cover the runs you simulate)")


def profile_yaml(hardware: HardwareSpec, name: str, result: dict) -> str:
    """The calibrated hardware profile: the base profile, renamed, plus ``fitted``."""
    import yaml

    body = {"name": name, "memory_gib": hardware.memory_gib,
            "hbm_bandwidth_gbps": hardware.hbm_bandwidth_gbps,
            "peak_fp16_tflops": hardware.peak_fp16_tflops,
            "kernel_profile": hardware.kernel_profile, "fitted": result["fitted"]}
    contiguous = result.get("contiguous")
    if contiguous is not None:  # the contiguous system's own fit (its decode kernel differs)
        body["fitted_contiguous"] = contiguous["fitted"]
    err = result["held_back_error"]
    header = [
        f"# {name}: hardware={hardware.name} calibrated by `python -m harness.tools.calibrate`",
        f"# on {result['device']}, {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}.",
        f"# Measured: {result['model']} ({result['layers']} layers, {result['dtype']}), grid "
        f"{result['grid']}.",
        f"# Held-back steps: {err.get('count', 0)}, median |error| {err.get('median_abs_pct')}%, "
        f"p90 {err.get('p90_abs_pct')}%.",
    ]
    if result["cpu_timings"]:
        header.append("# NOTE: CPU timings (no GPU): valid for this host only, not a GPU profile.")
    header.append(f"# NOTE: {_extrapolation_note(result)}")
    if contiguous is not None:
        c_err = contiguous["held_back_error"]
        header.append(f"# fitted: the paged system (block {result['grid']['block_size']}); "
                      f"fitted_contiguous: the contiguous oracle (held-back median |error| "
                      f"{c_err.get('median_abs_pct')}%, p90 {c_err.get('p90_abs_pct')}%).")
    header.append("# The fitted step time applies to that model (each system its layout's fit); "
                  "other models use the roofline with the derived efficiencies.")
    return "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    import torch

    from harness.errors import ConfigError, PagebenchError

    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(prog="python -m harness.tools.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-2-13b" if cuda else "tiny", help="conf/model entry")
    parser.add_argument("--hardware", default="h200" if cuda else "cpu", help="conf/hardware base profile")
    parser.add_argument("--name", default=None, help="profile name (default <hardware>-<model>-fit)")
    parser.add_argument("--out", type=output_file, default=None,
                        help="YAML path (default conf/hardware/<name>.yaml)")
    parser.add_argument("--force", action="store_true", help="replace an existing profile")
    parser.add_argument("--json", type=output_file, default=None,
                        help="also write the full result as JSON here")
    parser.add_argument("--layers", type=positive_int, default=None, help="num_layers_override")
    parser.add_argument("--dtype", default=None, help="override the model dtype")
    parser.add_argument("--device", type=device_arg, default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--batch-sizes", type=positive_ints, default=None, help="comma list, e.g. 1,8,32")
    parser.add_argument("--context-lens", type=positive_ints, default=None, help="comma list, e.g. 128,512")
    parser.add_argument("--output-len", type=positive_int, default=None)
    parser.add_argument("--holdout-every", type=positive_int, default=3,
                        help="hold back every n-th grid point (>= 2; default 3)")
    parser.add_argument("--block-size", type=positive_int, default=16)
    parser.add_argument("--layouts", default="paged,contiguous",
                        help="systems measured and fitted apart: paged, contiguous or both "
                             "(default paged,contiguous)")
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=8192)
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--cpu-threads", type=positive_int, default=1, help="torch threads on CPU runs")
    args = parser.parse_args(argv)
    if args.holdout_every < 2:
        parser.error("--holdout-every must be >= 2: every point held back leaves none to fit")
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not layouts or "paged" not in layouts or not set(layouts) <= {"paged", "contiguous"}:
        parser.error("--layouts must name paged, optionally with contiguous (paged,contiguous)")
    try:
        check_device(args.device)
        model = load_spec(ModelSpec, "model", args.model, "model")
        if args.layers is not None or args.dtype is not None:
            model = build_spec(ModelSpec, {**asdict(model), "dtype": args.dtype or model.dtype,
                                           "num_layers_override": args.layers or model.num_layers_override},
                               "model")
        hardware = load_spec(HardwareSpec, "hardware", args.hardware, "hardware")
        engine = build_spec(EngineSpec, {"executor": "torch", "device": args.device,
                                         "max_num_batched_tokens": args.max_num_batched_tokens,
                                         "cpu_threads": args.cpu_threads},
                            "engine")
        grid = dict(GPU_GRID if engine.device != "cpu" and cuda else CPU_GRID)
        if args.batch_sizes:
            grid["batch_sizes"] = args.batch_sizes
        if args.context_lens:
            grid["context_lens"] = args.context_lens
        if args.output_len:
            grid["output_len"] = args.output_len
        name = args.name or (args.out.stem if args.out else f"{hardware.name}-{model.name}-fit")
        out = args.out or CONF_DIR / "hardware" / f"{name}.yaml"
        if out.exists() and not args.force:  # checked before measuring
            raise ConfigError(f"{out} exists (a shipped or earlier profile): pass --force to "
                              "replace it, or --name / --out for a new one")
        results = {layout: calibrate(model, hardware, engine, holdout_every=args.holdout_every,
                                     block_size=args.block_size, seed=args.seed, layout=layout,
                                     log=lambda m: print(m, file=sys.stderr), **grid)
                   for layout in layouts}
        result = results["paged"]
        if "contiguous" in results:
            result["contiguous"] = results["contiguous"]
    except PagebenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile_yaml(hardware, name, result), encoding="utf-8")
    result["profile"] = str(out)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    err = result["held_back_error"]
    print(("CPU timings (no GPU): " if result["cpu_timings"] else "")
          + f"fit on {result['train_steps']} steps; held-back {err.get('count', 0)} steps: "
          f"median |error| {err.get('median_abs_pct')}%, p90 {err.get('p90_abs_pct')}% "
          f"(decode {result['held_back_decode_error'].get('median_abs_pct')}%, prefill "
          f"{result['held_back_prefill_error'].get('median_abs_pct')}%)")
    print(f"note: {_extrapolation_note(result)}")
    print(f"wrote {out}: use hardware={out.stem}" + ("" if out.parent == CONF_DIR / "hardware"
                                                     else f" (after copying it to {CONF_DIR / 'hardware'})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
