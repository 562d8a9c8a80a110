"""The indirection benchmark: what the block table costs inside decode attention.

``run_kernel_benchmark(spec, out_dir)`` sweeps batch x context x block size x head config
x dtype. For each point it times, on the same inputs:

* ``paged``       -- ``paged_decode_attention`` over a cache whose blocks are scattered
                     (a random permutation, as after allocator churn; ``block_order``);
* ``contiguous``  -- ``contiguous_decode_attention``, the same kernel without the table
                     (independent of the block size: timed once per batch x context);
* ``reference``   -- the torch reference (gather through the table, then dense attention);
* ``sdpa``        -- ``torch.nn.functional.scaled_dot_product_attention`` on the contiguous cache;
* ``flex``        -- ``torch.compile(flex_attention)`` with a paged block mask
                     (``torch.nn.attention.experimental._paged_attention``), where available.

Timing: on CUDA ``triton.testing.do_bench`` (median; it clears L2 between runs); on CPU a
timed loop, median of ``cpu_repeats`` after one warm-up, and the results say
``"timings": "cpu"``. On CPU "paged" and "contiguous" are the torch reference paths the
engine uses there (the interpreter is not a timing target).

Bytes that must move: K and V read once (``2 * batch * context * kv_heads * head_dim *
dtype``) plus q and out; achieved bandwidth = bytes / time, and its fraction of the copy
bandwidth measured in the same run (``dst.copy_(src)`` of ``copy_bytes``, read + write).

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
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from harness.errors import ConfigError
from kernels.bench_results import check_targets, markdown_table, summarize, write_results
from kernels.bench_spec import DTYPES, HeadConfig, KernelBenchSpec, _plain, load_spec
from kernels.contiguous_decode import contiguous_decode_attention
from kernels.decode_plan import launch_plan
from kernels.paged_decode import last_kernel_config, paged_decode_attention
from kernels.reference import paged_decode_attention_reference

__all__ = ["HeadConfig", "KernelBenchSpec", "check_targets", "load_spec", "main", "markdown_table",
           "run_kernel_benchmark", "summarize", "write_results"]

SCHEMA = "pagebench.kernel_bench/1"
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "conf" / "experiment" / "kernels.yaml"


# ---- timing ------------------------------------------------------------------------------------


class Timer:
    """Median milliseconds of a callable: do_bench on CUDA, a timed loop on CPU."""

    def __init__(self, device: torch.device, spec: KernelBenchSpec) -> None:
        self.device, self.spec = device, spec

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.device.type == "cuda":
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=self.spec.warmup_ms, rep=self.spec.rep_ms,
                                                 return_mode="median"))
        fn()
        samples = []
        for _ in range(self.spec.cpu_repeats):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)


def measure_copy_bandwidth(timer: Timer, device: torch.device, nbytes: int) -> float:
    """Device copy bandwidth in GB/s (bytes read + bytes written per second)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


# ---- inputs ----------------------------------------------------------------------------------


@dataclass
class DecodeInputs:
    """One batch of equal-length sequences in both layouts (the same logical K/V)."""

    q: torch.Tensor  # [batch, heads, head_dim]
    k_contig: torch.Tensor  # [batch * context, kv_heads, head_dim]
    v_contig: torch.Tensor
    seq_starts: torch.Tensor  # [batch]
    context_lens: torch.Tensor  # [batch]


def make_contiguous_inputs(head: HeadConfig, batch: int, context: int, dtype: torch.dtype,
                           device: torch.device, gen: torch.Generator) -> DecodeInputs:
    shape = (batch * context, head.num_kv_heads, head.head_dim)
    k = torch.empty(shape, dtype=dtype, device=device).normal_(generator=gen)
    v = torch.empty(shape, dtype=dtype, device=device).normal_(generator=gen)
    q = torch.empty(batch, head.num_heads, head.head_dim, dtype=dtype, device=device).normal_(generator=gen)
    starts = torch.arange(batch, dtype=torch.int32, device=device) * context
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return DecodeInputs(q, k, v, starts, lens)


def make_paged_layout(inputs: DecodeInputs, block_size: int, order: str, gen: torch.Generator):
    """The same K/V cut into blocks placed at random (or in order); returns (k, v, tables)."""
    batch, context = inputs.q.shape[0], int(inputs.context_lens[0])
    per_seq = -(-context // block_size)
    num_blocks = batch * per_seq
    device = inputs.q.device
    perm = (torch.randperm(num_blocks, generator=gen) if order == "random" else torch.arange(num_blocks))
    perm = perm.to(device)
    tables = perm.view(batch, per_seq).to(torch.int32)
    kv_heads, head_dim = inputs.k_contig.shape[1:]

    def scatter(contig: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros(batch, per_seq * block_size, kv_heads, head_dim, dtype=contig.dtype, device=device)
        padded[:, :context] = contig.view(batch, context, kv_heads, head_dim)
        paged = torch.empty(num_blocks, block_size, kv_heads, head_dim, dtype=contig.dtype, device=device)
        paged[perm] = padded.view(num_blocks, block_size, kv_heads, head_dim)
        return paged

    return scatter(inputs.k_contig), scatter(inputs.v_contig), tables


def _sdpa_call(inputs: DecodeInputs, head: HeadConfig):
    batch = inputs.q.shape[0]
    context = inputs.k_contig.shape[0] // batch
    q = inputs.q.unsqueeze(2)  # [batch, heads, 1, head_dim]
    k = inputs.k_contig.view(batch, context, head.num_kv_heads, head.head_dim).transpose(1, 2)
    v = inputs.v_contig.view(batch, context, head.num_kv_heads, head.head_dim).transpose(1, 2)
    gqa = head.num_heads != head.num_kv_heads
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v, enable_gqa=gqa)


_FLEX_COMPILED = None


def _flex_call(inputs: DecodeInputs, head: HeadConfig, k_paged, v_paged, tables, block_size: int):
    """flex_attention over the paged cache: logical block mask converted through the table."""
    global _FLEX_COMPILED
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _FLEX_COMPILED is None:
        import torch._dynamo

        for limit in ("recompile_limit", "cache_size_limit"):  # one compile per swept shape
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 64))
        _FLEX_COMPILED = torch.compile(flex_attention)
    batch, context = inputs.q.shape[0], int(inputs.context_lens[0])
    device = inputs.q.device
    num_blocks = k_paged.shape[0]
    paged = PagedAttention(num_blocks, block_size, batch, device=device)
    table = torch.full((batch, num_blocks), -1, dtype=torch.int64, device=device)
    table[:, :tables.shape[1]] = tables.long()
    to_logical = torch.full((batch, num_blocks), -1, dtype=torch.int64, device=device)
    rows = torch.arange(batch, device=device)[:, None].expand_as(tables)
    to_logical[rows, tables.long()] = torch.arange(tables.shape[1], device=device).expand_as(tables)
    paged.page_table, paged.physical_to_logical = table, to_logical  # our (scattered) tables
    logical = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx >= 0, batch, None, 1, context,
                                device=device, BLOCK_SIZE=(128, block_size))
    mask = paged.convert_logical_block_mask(logical, kv_len=inputs.context_lens.long())
    kv_heads, head_dim = k_paged.shape[2:]
    k = k_paged.view(-1, kv_heads, head_dim).transpose(0, 1).unsqueeze(0)  # [1, kv_heads, slots, D]
    v = v_paged.view(-1, kv_heads, head_dim).transpose(0, 1).unsqueeze(0)
    q = inputs.q.unsqueeze(2)
    gqa = head.num_heads != head.num_kv_heads
    return lambda: _FLEX_COMPILED(q, k, v, block_mask=mask, enable_gqa=gqa)


def _linear_call(head: HeadConfig, batch: int, dtype: torch.dtype, device: torch.device, gen):
    weights = [torch.empty(i, o, dtype=dtype, device=device).normal_(generator=gen) * 0.02
               for i, o in head.linear_shapes()]
    x = torch.empty(batch, max(i for i, _ in head.linear_shapes()), dtype=dtype, device=device).normal_(generator=gen)

    def run():
        for w in weights:
            torch.matmul(x[:, :w.shape[0]], w)

    nbytes = sum(w.numel() * w.element_size() for w in weights)
    return run, nbytes


# ---- the sweep ----------------------------------------------------------------------------------


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


def _try(errors: dict, key: str, fn: Callable[[], float]) -> float | None:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - one failed measurement must not end the sweep
        errors[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        if isinstance(exc, torch.OutOfMemoryError) and torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def run_kernel_benchmark(spec: Mapping, out_dir: Path, *, progress: bool = True) -> dict:
    """Run the sweep of ``spec`` (the ``kernel_bench`` node), write results into ``out_dir``.

    Writes ``kernel_results.json``, ``kernel_results.csv`` and ``kernel_results.md``;
    returns the JSON document (see the module docstring for every number in it).
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


def _run(spec: KernelBenchSpec, device: torch.device, out_dir: Path, progress: bool) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    timer = Timer(device, spec)
    gen = torch.Generator(device=device).manual_seed(spec.seed)
    host_gen = torch.Generator().manual_seed(spec.seed)
    copy_bytes = spec.copy_bytes if device.type == "cuda" else min(spec.copy_bytes, 64 << 20)
    copy_bw = measure_copy_bandwidth(timer, device, copy_bytes)
    backend = "auto" if device.type == "cuda" else "torch"
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    log(f"[kernels] device {_device_info(device)['name']} ({device.type}); copy bandwidth {copy_bw:.1f} GB/s")

    rows: list[dict] = []
    total = (len(spec.head_configs) * len(spec.dtypes) * len(spec.batch_sizes) * len(spec.context_lens)
             * len(spec.block_sizes))
    started = time.perf_counter()
    truncated = False

    def out_of_time() -> bool:
        return spec.time_budget_s is not None and time.perf_counter() - started > spec.time_budget_s

    for head in spec.head_configs:
        for dtype_name in spec.dtypes:
            dtype = DTYPES[dtype_name]
            for batch in spec.batch_sizes:
                if out_of_time():
                    truncated = True
                    break
                linear_ms = linear_roofline_ms = None
                linear_errors: dict = {}
                if head.has_model_dims:
                    run_linear, weight_bytes = _linear_call(head, batch, dtype, device, gen)
                    linear_ms = _try(linear_errors, "linear", lambda: timer(run_linear))
                    linear_roofline_ms = weight_bytes / (copy_bw * 1e9) * 1e3  # weights read once
                    del run_linear
                for context in spec.context_lens:
                    if out_of_time():
                        truncated = True
                        break
                    rows.extend(_sweep_point(spec, head, dtype_name, dtype, batch, context, device, backend,
                                             timer, gen, host_gen, copy_bw, linear_ms, linear_roofline_ms,
                                             dict(linear_errors)))
                    log(f"[kernels] {len(rows)}/{total} {head.name} {dtype_name} batch {batch} context {context}")
                    if device.type == "cuda":
                        torch.cuda.empty_cache()

    results = {
        "schema": SCHEMA,
        "timings": device.type,
        "truncated": truncated,  # the time budget ran out before the sweep ended
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": _device_info(device),
        "versions": {"torch": torch.__version__, "triton": _triton_version(), "python": sys.version.split()[0]},
        "copy_bandwidth_GBps": copy_bw,
        "method": {
            "timing": ("triton.testing.do_bench median (L2 cleared between runs)" if device.type == "cuda"
                       else f"CPU timings: median of {spec.cpu_repeats} timed calls after one warm-up"),
            "paged_impl": "triton" if device.type == "cuda" else "torch reference (CPU execution path)",
            "bytes": "K and V read once + q + out; block tables not counted",
            "copy_bandwidth": f"dst.copy_(src) of {copy_bytes} bytes, (read + write) / time",
            "block_order": spec.block_order,
            "contiguous": "independent of block size: timed once per (head config, dtype, batch, context)",
            "end_to_end": ("step = num_layers x (paged attention + linear), linear = measured time of one layer's "
                           "QKV, O and MLP matmuls at this batch; norms, RoPE, activations and LM head left out, "
                           "so indirection_share is an upper bound; linear_roofline_ms = weight bytes / "
                           "copy bandwidth"),
        },
        "spec": _plain(asdict(spec)),
        "rows": rows,
        "summary": summarize(rows),
        "targets": check_targets(rows) if device.type == "cuda" else None,
    }
    write_results(results, out_dir)
    return results


def _sweep_point(spec, head, dtype_name, dtype, batch, context, device, backend, timer, gen, host_gen,
                 copy_bw, linear_ms, linear_roofline_ms, errors) -> list[dict]:
    """All block sizes of one (head, dtype, batch, context); contiguous & SDPA timed once."""
    try:
        inputs = make_contiguous_inputs(head, batch, context, dtype, device, gen)
    except torch.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        errors["inputs"] = f"OutOfMemoryError: {str(exc).splitlines()[0][:200]}"
        return [_row(spec, head, dtype_name, batch, context, bs, None, {}, copy_bw, linear_ms,
                     linear_roofline_ms, errors) for bs in spec.block_sizes]
    common = {"num_splits": spec.num_splits, "tile_size": spec.tile_size, "num_stages": spec.num_stages,
              "max_context_len": context,
              "backend": backend}
    out = torch.empty_like(inputs.q)
    times: dict[str, float | None] = {}
    times["contiguous"] = _try(errors, "contiguous", lambda: timer(lambda: contiguous_decode_attention(
        inputs.q, inputs.k_contig, inputs.v_contig, inputs.seq_starts, inputs.context_lens, out=out, **common)))
    if "sdpa" in spec.baselines:
        times["sdpa"] = _try(errors, "sdpa", lambda: timer(_sdpa_call(inputs, head)))
    plan = None  # the CPU path is the torch reference: no launch plan
    if backend != "torch":
        plan = launch_plan(batch, head.num_heads, head.num_kv_heads, head.head_dim, max_context=context,
                           device=device, num_splits=spec.num_splits, tile_size=spec.tile_size,
                           num_stages=spec.num_stages)
    rows = []
    for block_size in spec.block_sizes:
        point_errors = dict(errors)
        point = dict(times)
        try:
            k_paged, v_paged, tables = make_paged_layout(inputs, block_size, spec.block_order, host_gen)
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            point_errors["paged_inputs"] = f"OutOfMemoryError: {str(exc).splitlines()[0][:200]}"
            rows.append(_row(spec, head, dtype_name, batch, context, block_size, plan, point, copy_bw, linear_ms,
                             linear_roofline_ms, point_errors))
            continue
        point["paged"] = _try(point_errors, "paged", lambda: timer(lambda: paged_decode_attention(
            inputs.q, k_paged, v_paged, tables, inputs.context_lens, out=out, **common)))
        if "reference" in spec.baselines and batch * context <= spec.reference_max_tokens:
            point["reference"] = _try(point_errors, "reference", lambda: timer(
                lambda: paged_decode_attention_reference(inputs.q, k_paged, v_paged, tables, inputs.context_lens)))
        if "flex" in spec.baselines and all(values is None or value in values for value, values in (
                (block_size, spec.flex_block_sizes), (batch, spec.flex_batch_sizes),
                (context, spec.flex_context_lens))):
            point["flex"] = _try(point_errors, "flex", lambda: timer(
                _flex_call(inputs, head, k_paged, v_paged, tables, block_size)))
        checks = _agreement(inputs, head, k_paged, v_paged, tables, block_size, spec, point, common, point_errors)
        del k_paged, v_paged, tables
        rows.append(_row(spec, head, dtype_name, batch, context, block_size, plan, point, copy_bw, linear_ms,
                         linear_roofline_ms, point_errors) | checks)
    return rows


def _agreement(inputs, head, k_paged, v_paged, tables, block_size, spec, times, common, errors) -> dict:
    """Max |difference| of paged, contiguous and flex outputs from SDPA's: the timed calls agree."""
    out = {"paged_vs_sdpa_max_abs": None, "contiguous_vs_sdpa_max_abs": None, "flex_vs_sdpa_max_abs": None}
    if times.get("sdpa") is None:
        return out
    try:
        expect = _sdpa_call(inputs, head)().squeeze(2).float()
        paged = paged_decode_attention(inputs.q, k_paged, v_paged, tables, inputs.context_lens, **common)
        contig = contiguous_decode_attention(inputs.q, inputs.k_contig, inputs.v_contig, inputs.seq_starts,
                                             inputs.context_lens, **common)
        out["paged_vs_sdpa_max_abs"] = float((paged.float() - expect).abs().max())
        out["contiguous_vs_sdpa_max_abs"] = float((contig.float() - expect).abs().max())
        if times.get("flex") is not None:
            flex = _flex_call(inputs, head, k_paged, v_paged, tables, block_size)().squeeze(2).float()
            out["flex_vs_sdpa_max_abs"] = float((flex - expect).abs().max())
    except Exception as exc:  # noqa: BLE001
        errors["agreement"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return out


def _row(spec, head, dtype_name, batch, context, block_size, plan, times, copy_bw, linear_ms,
         linear_roofline_ms, errors) -> dict:
    elt = DTYPES[dtype_name].itemsize
    kv_bytes = 2 * batch * context * head.num_kv_heads * head.head_dim * elt
    io_bytes = 2 * batch * head.num_heads * head.head_dim * elt
    nbytes = kv_bytes + io_bytes
    paged, contig = times.get("paged"), times.get("contiguous")

    def gbps(ms):
        return None if ms is None else nbytes / (ms * 1e-3) / 1e9

    layers = head.num_layers
    step_ms = indirection_ms = share = None
    if layers and paged is not None and linear_ms is not None:
        step_ms = layers * (paged + linear_ms)
        if contig is not None:
            indirection_ms = layers * (paged - contig)
            share = indirection_ms / step_ms
    return {
        "head_config": head.name, "num_heads": head.num_heads, "num_kv_heads": head.num_kv_heads,
        "head_dim": head.head_dim, "dtype": dtype_name, "batch": batch, "context_len": context,
        "block_size": block_size, "num_splits": plan.num_splits if plan else None,
        "tile_size": plan.tile_n if plan else None,
        "paged_ms": paged, "contiguous_ms": contig, "reference_ms": times.get("reference"),
        "sdpa_ms": times.get("sdpa"), "flex_ms": times.get("flex"),
        "kv_bytes": kv_bytes, "io_bytes": io_bytes, "bytes": nbytes,
        "paged_GBps": gbps(paged), "contiguous_GBps": gbps(contig),
        "paged_frac_copy_bw": _ratio(gbps(paged), copy_bw), "contiguous_frac_copy_bw": _ratio(gbps(contig), copy_bw),
        "paged_over_contiguous": _ratio(paged, contig), "paged_over_flex": _ratio(paged, times.get("flex")),
        "paged_over_sdpa": _ratio(paged, times.get("sdpa")),
        "num_layers": layers, "linear_ms": linear_ms, "linear_roofline_ms": linear_roofline_ms,
        "step_ms": step_ms, "indirection_ms_per_step": indirection_ms, "indirection_share": share,
        "errors": "; ".join(f"{k}: {v}" for k, v in errors.items()) or None,
    }


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
    parser = argparse.ArgumentParser(prog="python -m kernels.benchmark", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="YAML with a kernel_bench node (default: conf/experiment/kernels.yaml)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: outputs/kernels/<time>)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=YAML",
                        help="override a spec key, e.g. --set batch_sizes=[1,8] (repeatable)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
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
    out = args.out or Path("outputs") / "kernels" / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    try:
        results = run_kernel_benchmark(spec, out, progress=not args.quiet)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown_table(results))
    print(f"wrote {out}/kernel_results.json, .csv, .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

