"""The indirection benchmark: what the block table costs inside decode attention.

``run_kernel_benchmark(spec, out_dir)`` sweeps batch x context x block size x head config
x dtype in the order of ``pagebench.kernels.bench_plan`` (the target points first). For each point
it times, on the same inputs:

* ``paged``       -- ``paged_decode_attention`` over a cache whose blocks are scattered
                     (a random permutation, as after allocator churn; ``block_order``);
* ``contiguous``  -- ``contiguous_decode_attention``, the same kernel without the table
                     (independent of the block size: timed once per batch x context);
* ``reference``   -- the torch reference (gather through the table, then dense attention);
* ``sdpa``        -- ``torch.nn.functional.scaled_dot_product_attention`` on the contiguous cache,
                     on CUDA once per backend (cuDNN, FlashAttention, memory-efficient; a
                     backend that refuses the shape is recorded as unsupported): the best
                     one is the yardstick (``sdpa_ms``, ``sdpa_backend``);
* ``flex``        -- ``torch.compile(flex_attention)`` with a paged block mask
                     (``torch.nn.attention.experimental._paged_attention``; ``enable_gqa``
                     for GQA), last, where available.

Nothing measured is lost: every point is appended to ``kernel_points.jsonl`` (and flushed)
as soon as it is measured, and ``kernel_results.{json,csv,md}`` are built from that file
-- at the end, on Ctrl-C / SIGINT (the GPU check's stage timeout), or afterwards with
``python -m pagebench.kernels.benchmark --summarize DIR``.

Timing (``pagebench.kernels.bench_timing``): on CUDA every figure is CUDA-graph replay
with a cold L2 (median of rounds; ``*_ms``), with the eager, event-timed call beside it
(``*_launch_us``); the torch reference, which syncs, is timed eagerly. On CPU a timed
loop, median of ``cpu_repeats`` after one warm-up, and the results say ``"timings":
"cpu"``. On CPU "paged" and "contiguous" are the torch reference paths the engine uses
there (the interpreter is not a timing target).

``errors`` names failures of the measured kernels (paged, contiguous; such a row prices
nothing); ``baseline_errors`` those of the baselines (SDPA backends, flex, reference, linear).

Bytes that must move: K and V read once (``2 * batch * context * kv_heads * head_dim *
dtype``) plus q and out; achieved bandwidth = bytes / time, and its fraction of the read
and of the copy bandwidth measured in the same run (``pagebench.kernels.bandwidth``; read-only is
the ceiling for decode).

End-to-end share (needs ``hidden_size`` and ``intermediate_size`` in the head config): one
decode step = ``num_layers x (attention + linear)``, where linear is the *measured* time of
one layer's projection matmuls at this batch (QKV, O, MLP up/gate and down with random
weights, on the same device); norms, RoPE, activations and the LM head are left out, so
``indirection_share = layers x (paged - contiguous) / step`` is an upper bound. A
roofline estimate of the same matmuls (weight bytes / copy bandwidth) is reported beside.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from pathlib import Path

import torch

import harness
from harness.errors import ConfigError
from pagebench.kernels.bandwidth import copy_bandwidth, read_bandwidth
from pagebench.kernels.bench_inputs import (SDPA_BACKENDS, flex_call, linear_call, make_contiguous_inputs,
                                           make_paged_layout, sdpa_call)
from pagebench.kernels.bench_plan import PHASES, Visit, describe, estimate_s, plan_visits
from pagebench.kernels import _runtime as rt
from pagebench.kernels.bench_results import (POINTS_FILE, PointLog, check_targets, markdown_table, results_from_log,
                                   row_of, summarize, write_results)
from pagebench.kernels.bench_timing import CpuTimer, GraphTimer, Timing
from pagebench.kernels.bench_spec import DTYPES, HeadConfig, KernelBenchSpec, _plain, load_spec
from pagebench.kernels.contiguous_decode import contiguous_decode_attention
from pagebench.kernels.decode_plan import launch_plan
from pagebench.kernels.paged_decode import last_kernel_config, paged_decode_attention
from pagebench.kernels.reference import paged_decode_attention_reference

__all__ = ["HeadConfig", "KernelBenchSpec", "check_targets", "load_spec", "main", "markdown_table",
           "run_kernel_benchmark", "summarize", "write_results"]

SCHEMA = "pagebench.kernel_bench/1"
DEFAULT_CONFIG = harness.CONF_DIR / "experiment" / "kernels.yaml"


def make_timer(device: torch.device, spec: KernelBenchSpec):
    """``GraphTimer`` on CUDA, ``CpuTimer`` elsewhere (``pagebench.kernels.bench_timing``)."""
    if device.type == "cuda":
        return GraphTimer(device, warmup_ms=spec.warmup_ms, rep_ms=spec.rep_ms)
    return CpuTimer(spec.cpu_repeats)


def _resolve_device(name: str) -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("kernel_bench.device=cuda but no CUDA device is visible; use auto or cpu")
        return torch.device("cuda")
    return torch.device("cpu")


def _device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "sm_count": props.multi_processor_count,
                "memory_GiB": round(props.total_memory / 2**30, 1)}
    import platform

    return {"type": "cpu", "name": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads()}


def _try(errors: dict, key: str, fn: Callable[[], Timing]) -> Timing | None:
    try:
        timing = fn()
        if timing.error and timing.ms is None:
            errors[key] = timing.error
        return timing
    except Exception as exc:  # noqa: BLE001 - one failed measurement must not end the sweep
        errors[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        if isinstance(exc, torch.OutOfMemoryError) and torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


def run_kernel_benchmark(spec: Mapping, out_dir: Path, *, progress: bool = True) -> dict:
    """Run the sweep of ``spec`` (the ``kernel_bench`` node), write results into ``out_dir``.

    Writes ``kernel_points.jsonl`` as it goes, then ``kernel_results.json``, ``.csv`` and
    ``.md``; returns the JSON document (see the module docstring for every number in it).
    """
    base = spec if isinstance(spec, KernelBenchSpec) else KernelBenchSpec.from_mapping(spec)
    device = _resolve_device(base.device)
    spec = base.for_device(device)
    threads = torch.get_num_threads()
    if device.type == "cpu" and spec.cpu_threads:
        # NOTE: on a shared CPU, multi-threaded OpenMP regions stall for scheduler quanta
        # (single calls of 100+ ms); one thread gives stable medians.
        torch.set_num_threads(spec.cpu_threads)
    try:
        return _run(spec, device, Path(out_dir), progress)
    finally:
        torch.set_num_threads(threads)


def _header(spec: KernelBenchSpec, device: torch.device, visits: list[Visit], copy_bytes: int) -> dict:
    planned = {p: sum(len(v.block_sizes) for v in visits if v.phase == p) for p in PHASES}
    return {
        "kind": "header", "schema": SCHEMA, "timings": device.type,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": _device_info(device),
        "versions": {"torch": torch.__version__, "triton": _triton_version(), "python": sys.version.split()[0]},
        "method": {
            "timing": ("CUDA-graph replay, cold L2 (pagebench.kernels.bench_timing.GraphTimer): per call, the median "
                       "over rounds of (graph of n flushed calls - graph of n flushes) / n; *_launch_us: eager "
                       "do_bench median of one Python call; reference: eager" if device.type == "cuda"
                       else f"CPU timings: median of {spec.cpu_repeats} timed calls after one warm-up"),
            "kernel_timing": "cuda_graph" if device.type == "cuda" else "cpu",
            "paged_impl": ("triton (decode_plan.select_config: one fixed config per shape, no autotuning)" if device.type == "cuda"
                           else "torch reference (CPU execution path)"),
            "bytes": "K and V read once + q + out; block tables not counted",
            "copy_bandwidth": f"dst.copy_(src) of {copy_bytes} bytes, (read + write) / time",
            "read_bandwidth": f"every byte of {copy_bytes} bytes read once (pagebench.kernels.bandwidth), read / time",
            "block_order": spec.block_order,
            "order": "phases target, block_sweep, rest, flex (pagebench.kernels.bench_plan)",
            "contiguous": "independent of block size: timed once per (head config, dtype, batch, context)",
            "end_to_end": ("step = num_layers x (paged attention + linear), linear = measured time of one layer's "
                           "QKV, O and MLP matmuls at this batch; norms, RoPE, activations and LM head left out, "
                           "so indirection_share is an upper bound; linear_roofline_ms = weight bytes / "
                           "copy bandwidth"),
        },
        "spec": _plain(asdict(spec)),
        "planned_points": planned,
        "estimate_s": estimate_s(spec, visits) if device.type == "cuda" else None,
    }


class _Sweep:
    """The state one run carries between visits (timer, generators, per-group timings)."""

    def __init__(self, spec: KernelBenchSpec, device: torch.device, log: PointLog, say) -> None:
        self.spec, self.device, self.log, self.say = spec, device, log, say
        self.timer = make_timer(device, spec)
        self.backend = "auto" if device.type == "cuda" else "torch"
        self.group_times: dict[tuple, dict] = {}
        self.linear: dict[tuple, tuple] = {}
        self.ceilings: dict = {}

    def common(self, context: int) -> dict:
        s = self.spec
        return {"num_splits": s.num_splits, "tile_size": s.tile_size, "num_stages": s.num_stages,
                "max_context_len": context, "backend": self.backend}

    def ms(self, fn: Callable[[], object]) -> float:
        """The headline figure of ``fn`` (graph-timed on CUDA); an error when it has none."""
        timing = self.timer(fn)
        if timing.ms is None:
            raise RuntimeError(timing.error)
        return timing.ms

    def measure_ceilings(self, copy_bytes: int) -> None:
        t0 = time.perf_counter()
        self.ceilings = {"copy_bandwidth_GBps": copy_bandwidth(self.ms, self.device, copy_bytes),
                         "read_bandwidth_GBps": read_bandwidth(self.ms, self.device, copy_bytes)}
        self.log.write({"kind": "ceilings", **self.ceilings, "seconds": time.perf_counter() - t0})
        self.say(f"[kernels] copy bandwidth {self.ceilings['copy_bandwidth_GBps']:.1f} GB/s, read bandwidth "
                 f"{self.ceilings['read_bandwidth_GBps']:.1f} GB/s ({time.perf_counter() - t0:.1f} s)")

    def inputs(self, visit: Visit):
        gen = torch.Generator(device=self.device).manual_seed(self.spec.seed + zlib.crc32(repr(visit.group).encode()))
        return make_contiguous_inputs(visit.head, visit.batch, visit.context, DTYPES[visit.dtype], self.device, gen)

    def visit(self, visit: Visit) -> int:
        """Measure one visit; returns the points written."""
        if visit.phase == "flex":
            return self._flex(visit)
        if visit.phase == "repeat":
            return self._repeat(visit)
        spec, head, errors, baseline_errors = self.spec, visit.head, {}, {}
        key = (head.name, visit.dtype, visit.batch)
        if head.has_model_dims and key not in self.linear:
            lin_errors: dict = {}
            run_linear, weight_bytes = linear_call(head, visit.batch, DTYPES[visit.dtype], self.device,
                                                   torch.Generator(device=self.device).manual_seed(spec.seed))
            timing = _try(lin_errors, "linear", lambda: self.timer(run_linear))
            self.linear[key] = (timing.ms if timing else None,
                                weight_bytes / (self.ceilings["copy_bandwidth_GBps"] * 1e9) * 1e3, lin_errors)
            del run_linear
        linear_ms, roofline_ms, lin_errors = self.linear.get(key, (None, None, {}))
        baseline_errors.update(lin_errors)
        try:
            inputs = self.inputs(visit)
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            errors["inputs"] = f"OutOfMemoryError: {str(exc).splitlines()[0][:200]}"
            for bs in visit.block_sizes:
                self.log.write(self._row(visit, bs, None, {}, linear_ms, roofline_ms, errors, baseline_errors))
            return len(visit.block_sizes)
        common = self.common(visit.context)
        out = torch.empty_like(inputs.q)
        times = self.group_times.get(visit.group)
        if times is None:  # contiguous and SDPA once per group (they do not depend on the block size)
            times = {"errors": {}, "baseline_errors": {}}
            times["contiguous"] = _try(times["errors"], "contiguous", lambda: self.timer(
                lambda: contiguous_decode_attention(inputs.q, inputs.k_contig, inputs.v_contig, inputs.seq_starts,
                                                    inputs.context_lens, out=out, **common)))
            times["contiguous_config"] = last_kernel_config() if self.backend != "torch" else None
            if "sdpa" in spec.baselines:
                times.update(self._sdpa(inputs, head, times["baseline_errors"]))
            self.group_times[visit.group] = times
        errors.update(times["errors"])
        baseline_errors.update(times["baseline_errors"])
        plan = None  # the CPU path is the torch reference: no launch plan
        if self.backend != "torch":
            plan = launch_plan(visit.batch, head.num_heads, head.num_kv_heads, head.head_dim, max_context=visit.context,
                               sms=rt.num_sms(self.device), itemsize=DTYPES[visit.dtype].itemsize,
                               num_splits=spec.num_splits, tile_size=spec.tile_size, num_stages=spec.num_stages)
        for block_size in visit.block_sizes:
            point_errors, point_baseline_errors = dict(errors), dict(baseline_errors)
            point = {k: times.get(k) for k in ("contiguous", "sdpa", "contiguous_config", "sdpa_backend",
                                               "sdpa_backends")}
            try:
                k_paged, v_paged, tables = make_paged_layout(inputs, block_size, spec.block_order,
                                                             torch.Generator().manual_seed(spec.seed + block_size))
            except torch.OutOfMemoryError as exc:
                torch.cuda.empty_cache()
                point_errors["paged_inputs"] = f"OutOfMemoryError: {str(exc).splitlines()[0][:200]}"
                self.log.write(self._row(visit, block_size, plan, point, linear_ms, roofline_ms, point_errors,
                                         point_baseline_errors))
                continue
            point["paged"] = _try(point_errors, "paged", lambda: self.timer(lambda: paged_decode_attention(
                inputs.q, k_paged, v_paged, tables, inputs.context_lens, out=out, **common)))
            point["paged_config"] = last_kernel_config() if self.backend != "torch" else None
            if "reference" in spec.baselines and visit.batch * visit.context <= spec.reference_max_tokens:
                point["reference"] = _try(point_baseline_errors, "reference", lambda: self.timer(
                    lambda: paged_decode_attention_reference(inputs.q, k_paged, v_paged, tables, inputs.context_lens),
                    graph=False))
            checks = _agreement(inputs, head, k_paged, v_paged, tables, point, common, point_baseline_errors)
            del k_paged, v_paged, tables
            self.log.write(self._row(visit, block_size, plan, point, linear_ms, roofline_ms, point_errors,
                                     point_baseline_errors) | checks)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return len(visit.block_sizes)

    def _sdpa(self, inputs, head, baseline_errors: dict) -> dict:
        """SDPA per backend (CUDA) or torch's default dispatch (CPU); the best is the yardstick."""
        backends = SDPA_BACKENDS if self.device.type == "cuda" else (None,)
        timings = {}
        for backend in backends:
            name = backend or "default"
            timing = _try(baseline_errors, f"sdpa_{name}", lambda: self.timer(sdpa_call(inputs, head, backend)))
            if timing is not None and timing.ms is not None:
                timings[name] = timing
        best = min(timings, key=lambda n: timings[n].ms) if timings else None
        return {"sdpa": timings.get(best), "sdpa_backend": best,
                "sdpa_backends": {n: (timings[n].ms if n in timings else None) for n in
                                  (b or "default" for b in backends)}}

    def _row(self, visit, block_size, plan, times, linear_ms, roofline_ms, errors, baseline_errors) -> dict:
        return {"kind": "point", "phase": visit.phase, **row_of(
            visit.head, visit.dtype, DTYPES[visit.dtype].itemsize, visit.batch, visit.context, block_size, plan,
            times, self.ceilings, linear_ms, roofline_ms, errors, baseline_errors)}

    def _repeat(self, visit: Visit) -> int:
        """The paged kernel timed again on fresh inputs of the same point (stability target)."""
        inputs, errors = self.inputs(visit), {}
        out = torch.empty_like(inputs.q)
        for block_size in visit.block_sizes:
            k_paged, v_paged, tables = make_paged_layout(inputs, block_size, self.spec.block_order,
                                                         torch.Generator().manual_seed(self.spec.seed + block_size))
            timing = _try(errors, "paged", lambda: self.timer(lambda: paged_decode_attention(
                inputs.q, k_paged, v_paged, tables, inputs.context_lens, out=out, **self.common(visit.context))))
            self.log.write({"kind": "repeat", "head_config": visit.head.name, "dtype": visit.dtype,
                            "batch": visit.batch, "context_len": visit.context, "block_size": block_size,
                            "paged_ms": timing.ms if timing else None,
                            "paged_launch_us": timing.launch_us if timing else None,
                            "errors": "; ".join(f"{k}: {v}" for k, v in errors.items()) or None})
            del k_paged, v_paged, tables
        return len(visit.block_sizes)

    def _flex(self, visit: Visit) -> int:
        inputs = self.inputs(visit)
        for block_size in visit.block_sizes:
            errors: dict = {}
            record = {"kind": "flex", "head_config": visit.head.name, "dtype": visit.dtype, "batch": visit.batch,
                      "context_len": visit.context, "block_size": block_size, "flex_ms": None,
                      "flex_launch_us": None, "flex_vs_sdpa_max_abs": None}
            try:
                k_paged, v_paged, tables = make_paged_layout(inputs, block_size, self.spec.block_order,
                                                             torch.Generator().manual_seed(self.spec.seed + block_size))
                call = flex_call(inputs, visit.head, k_paged, v_paged, tables, block_size)
                timing = _try(errors, "flex", lambda: self.timer(call))
                if timing is not None:
                    record["flex_ms"], record["flex_launch_us"] = timing.ms, timing.launch_us
                    expect = sdpa_call(inputs, visit.head)().squeeze(2).float()
                    record["flex_vs_sdpa_max_abs"] = float((call().squeeze(2).float() - expect).abs().max())
            except Exception as exc:  # noqa: BLE001 - flex is a baseline: its failure is recorded
                errors["flex"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            self.log.write(record | {"errors": "; ".join(f"{k}: {v}" for k, v in errors.items()) or None})
        return len(visit.block_sizes)


def _run(spec: KernelBenchSpec, device: torch.device, out_dir: Path, progress: bool) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    copy_bytes = spec.copy_bytes if device.type == "cuda" else min(spec.copy_bytes, 64 << 20)
    visits = plan_visits(spec)
    started = time.perf_counter()
    with PointLog(out_dir / POINTS_FILE) as log:
        header = _header(spec, device, visits, copy_bytes)
        log.write(header)
        estimate = header["estimate_s"] or {}
        sweep = _Sweep(spec, device, log, say)
        say(f"[kernels] device {header['device']['name']} ({device.type}); {len(visits)} visits planned")
        phase, phase_start, phase_points, done, reason = None, started, 0, 0, None

        def close_phase() -> None:
            if phase is not None:
                actual = time.perf_counter() - phase_start
                log.write({"kind": "phase", "name": phase, "points": phase_points,
                           "estimate_s": estimate.get(phase), "actual_s": actual})
                est = f"{estimate[phase]:.0f} s" if phase in estimate else "n/a"
                say(f"[kernels] phase {phase}: {phase_points} points, estimated {est}, actual {actual:.0f} s")

        try:
            sweep.measure_ceilings(copy_bytes)
            for visit in visits:
                if spec.time_budget_s is not None and time.perf_counter() - started > spec.time_budget_s:
                    reason = f"time budget of {spec.time_budget_s} s spent"
                    break
                if visit.phase != phase:
                    close_phase()
                    phase, phase_start, phase_points = visit.phase, time.perf_counter(), 0
                n = sweep.visit(visit)
                phase_points += n
                done += n
                say(f"[kernels] {done} points, {time.perf_counter() - started:.0f} s: {visit.phase} {visit.head.name} "
                    f"{visit.dtype} batch {visit.batch} context {visit.context} block {list(visit.block_sizes)}")
        except KeyboardInterrupt:
            reason = "interrupted (SIGINT)"
        close_phase()
        log.write({"kind": "end", "truncated": reason is not None, "reason": reason,
                   "seconds": time.perf_counter() - started})
    results = results_from_log(out_dir / POINTS_FILE)
    write_results(results, out_dir)
    return results


def _agreement(inputs, head, k_paged, v_paged, tables, times, common, errors) -> dict:
    """Max |difference| of paged and contiguous outputs from SDPA's: the timed calls agree."""
    out = {"paged_vs_sdpa_max_abs": None, "contiguous_vs_sdpa_max_abs": None}
    if times.get("paged") is None and times.get("contiguous") is None:
        return out
    try:
        expect = sdpa_call(inputs, head)().squeeze(2).float()
        paged = paged_decode_attention(inputs.q, k_paged, v_paged, tables, inputs.context_lens, **common)
        contig = contiguous_decode_attention(inputs.q, inputs.k_contig, inputs.v_contig, inputs.seq_starts,
                                             inputs.context_lens, **common)
        out["paged_vs_sdpa_max_abs"] = float((paged.float() - expect).abs().max())
        out["contiguous_vs_sdpa_max_abs"] = float((contig.float() - expect).abs().max())
    except Exception as exc:  # noqa: BLE001
        errors["agreement"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return out


def _triton_version() -> str:
    import triton

    return triton.__version__


# ---- CLI ----------------------------------------------------------------------------------------


def prefer_explicit(spec: dict, keys: Iterable[str]) -> dict:
    """Copy each of ``keys`` (the ones the user set) over its ``cpu`` override in ``spec``:
    what a user asks for wins on a CPU too."""
    cpu = spec.get("cpu")
    if isinstance(cpu, dict):
        for key in keys:
            if key in cpu and key in spec:
                cpu[key] = spec[key]
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagebench.kernels.benchmark", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="YAML with a kernel_bench node (default: conf/experiment/kernels.yaml)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: outputs/kernels/<time>)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=YAML",
                        help="override a spec key, e.g. --set batch_sizes=[1,8] (repeatable)")
    parser.add_argument("--plan", action="store_true",
                        help="print the points in measuring order and the CUDA time estimate; measure nothing "
                             "(needs no GPU; --device cpu shows the CPU sweep)")
    parser.add_argument("--summarize", type=Path, metavar="DIR", default=None,
                        help=f"rebuild DIR/kernel_results.* from DIR/{POINTS_FILE} (after a killed run)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.summarize is not None:
            results = results_from_log(args.summarize / POINTS_FILE)
            write_results(results, args.summarize)
            print(markdown_table(results))
            return 0
        spec = load_spec(args.config)
        import yaml

        for item in args.set:
            key, _, value = item.partition("=")
            if not _:
                parser.error(f"--set expects KEY=VALUE, got {item!r}")
            spec[key] = yaml.safe_load(value)
        prefer_explicit(spec, [item.partition("=")[0] for item in args.set])
        if args.device:
            spec["device"] = args.device
        if args.plan:
            parsed = KernelBenchSpec.from_mapping(spec)
            planned = parsed.for_device(torch.device("cpu")) if parsed.device == "cpu" else parsed
            print(describe(planned, plan_visits(planned)))
            return 0
        out = args.out or Path("outputs") / "kernels" / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        results = run_kernel_benchmark(spec, out, progress=not args.quiet)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown_table(results))
    print(f"wrote {out}/kernel_results.json, .csv, .md ({POINTS_FILE}: every point as measured)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
