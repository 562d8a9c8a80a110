"""The kernel benchmark's measuring order and its time estimate (no device needed).

A GPU lent for minutes may stop the sweep at any point, so the points are measured in
phases, most wanted first:

1. ``target``: the points the H200 targets are judged on -- fp16, block 16, batch >= 32,
   context >= 4096, every head config (MHA and GQA interleaved: a truncated phase keeps
   both) -- paged, contiguous, SDPA (and the reference where it is timed);
2. ``block_sweep``: the other block sizes at those (batch, context) points;
3. ``rest``: every other point of the sweep;
4. ``repeat``: the paged kernel re-timed at block 16 for every batch >= ``repeat_min_batch``
   (the stability target: two figures minutes apart);
5. ``flex``: torch's flex_attention at its points (one ``torch.compile`` per shape, the
   slowest thing the benchmark does: last).

The bandwidth ceilings (copy and read) are measured before phase 1.

Estimate (CUDA): each timed call takes the eager ``do_bench`` windows (``warmup_ms +
rep_ms``) plus ``DO_BENCH_OVERHEAD_S``, and the graph timing (``bench_timing``): two
captures of at most ``MAX_LAUNCHES`` calls (``HOST_CALL_S`` each) and ``ROUNDS`` replays of
both graphs (``2 x MAX_LAUNCHES`` flushes of ``FLUSH_S`` and ``TARGET_GRAPH_MS`` of calls);
each new Triton kernel variant costs ``TRITON_COMPILE_S``; each flex shape
``FLEX_COMPILE_S``. The benchmark prints this estimate beside the actual time per phase.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pagebench.kernels.bench_spec import HeadConfig, KernelBenchSpec
from pagebench.kernels.bench_timing import FLUSH_MIN_BYTES, MAX_LAUNCHES, ROUNDS, TARGET_GRAPH_MS

TARGET_DTYPE, TARGET_BLOCK, TARGET_MIN_BATCH, TARGET_MIN_CONTEXT = "float16", 16, 32, 4096
PHASES = ("target", "block_sweep", "rest", "repeat", "flex")

# Measured on this project's CI machine (2 shared cores, 2026-12-01): `python -m
# pagebench.kernels.compile_check --case gqa-8b-bs16 --case mha-13b-bs16 --case contiguous-gqa-8b
# --case gqa-8b-bs1 --case gqa-8b-bs256` compiled 5 decode variants for sm_90 in 16.8 s
# (process start included): ~3 s each. The H200 host compiles the same way (Triton + ptxas).
TRITON_COMPILE_S = 3.0
# Measured on the same machine: the first torch.compile(flex_attention) call took 152 s and
# a new shape 58 s (CPU inductor, machine shared); the GPU path differs -- an upper prior.
FLEX_COMPILE_S = 60.0
# do_bench beyond its windows: the first call, 5 timing-estimate calls and a sync (bounded
# by 10 ms for the kernels here, whose calls take < 1 ms on an H200).
DO_BENCH_OVERHEAD_S = 0.01
# Host time of one Python call of a wrapper: the eager figures of the 2026-12-04 H200 record
# (benchmarks/gpu/2026-12-04-h200) had floors of 0.10-0.31 ms where the kernel needs less.
HOST_CALL_S = 0.3e-3
# One L2 flush: 256 MiB read at the 4268 GB/s read bandwidth measured in that record.
FLUSH_S = FLUSH_MIN_BYTES / 4268e9
SDPA_BACKENDS_TIMED = 3  # cuDNN, flash, efficient (bench_inputs.SDPA_BACKENDS)


@dataclass(frozen=True)
class Visit:
    """One (head config, dtype, batch, context) with the block sizes measured there now."""

    phase: str
    head: HeadConfig
    dtype: str
    batch: int
    context: int
    block_sizes: tuple[int, ...]

    @property
    def group(self) -> tuple:
        return (self.head.name, self.dtype, self.batch, self.context)


def _is_target(dtype: str, batch: int, context: int) -> bool:
    return dtype == TARGET_DTYPE and batch >= TARGET_MIN_BATCH and context >= TARGET_MIN_CONTEXT


def _flex_point(spec: KernelBenchSpec, batch: int, context: int, block_size: int) -> bool:
    return all(values is None or value in values for value, values in (
        (block_size, spec.flex_block_sizes), (batch, spec.flex_batch_sizes), (context, spec.flex_context_lens)))


def plan_visits(spec: KernelBenchSpec) -> list[Visit]:
    """Every point of ``spec`` once (flex points twice: measured, then flex), in phase order."""
    groups = [(dtype, batch, context) for dtype in spec.dtypes for batch in spec.batch_sizes
              for context in spec.context_lens]
    targets = [g for g in groups if _is_target(*g)] if TARGET_BLOCK in spec.block_sizes else []
    targets.sort(key=lambda g: (g[1], g[2]))
    others = [bs for bs in spec.block_sizes if bs != TARGET_BLOCK]
    visits = []

    def add(phase: str, group_list, block_sizes_of) -> None:
        for dtype, batch, context in group_list:
            for head in spec.head_configs:  # heads innermost: a cut phase keeps every head config
                sizes = tuple(block_sizes_of(dtype, batch, context))
                if sizes:
                    visits.append(Visit(phase, head, dtype, batch, context, sizes))

    add("target", targets, lambda *g: (TARGET_BLOCK,))
    add("block_sweep", targets, lambda *g: others)
    add("rest", [g for g in groups if g not in targets], lambda *g: spec.block_sizes)
    if spec.repeat_min_batch is not None and TARGET_BLOCK in spec.block_sizes:
        add("repeat", [g for g in groups if g[1] >= spec.repeat_min_batch], lambda *g: (TARGET_BLOCK,))
    if "flex" in spec.baselines:
        add("flex", groups, lambda d, b, c: [bs for bs in spec.block_sizes if _flex_point(spec, b, c, bs)])
    return visits


def _variants(spec: KernelBenchSpec, visit: Visit, seen: set) -> Iterator[tuple]:
    """The Triton kernel variants this visit compiles that no earlier visit did."""
    head = visit.head
    shape = (head.head_dim, head.num_heads // head.num_kv_heads, visit.dtype)
    wanted = [("contiguous", 1)] + [("paged", bs) for bs in visit.block_sizes]
    for layout, block_size in wanted:
        key = (layout, block_size, *shape)
        if key not in seen:
            seen.add(key)
            yield key


def timed_call_s(spec: KernelBenchSpec) -> float:
    """Prior seconds of one timed call on CUDA: eager windows + graph captures and replays."""
    eager = (spec.warmup_ms + spec.rep_ms) / 1e3 + DO_BENCH_OVERHEAD_S
    graph = 2 * MAX_LAUNCHES * HOST_CALL_S + ROUNDS * (2 * MAX_LAUNCHES * FLUSH_S + TARGET_GRAPH_MS / 1e3)
    return eager + graph


def estimate_s(spec: KernelBenchSpec, visits: list[Visit]) -> dict[str, float]:
    """Estimated seconds per phase on CUDA (module docstring), plus "ceilings" and "total"."""
    call_s = timed_call_s(spec)
    eager_s = (spec.warmup_ms + spec.rep_ms) / 1e3 + DO_BENCH_OVERHEAD_S
    out = {"ceilings": 2 * call_s + TRITON_COMPILE_S}
    seen_variants: set = set()
    seen_groups: set = set()
    seen_linear: set = set()
    for visit in visits:
        t = 0.0
        if visit.phase == "flex":
            t += len(visit.block_sizes) * (FLEX_COMPILE_S + call_s)
        elif visit.phase == "repeat":
            t += len(visit.block_sizes) * call_s
        else:
            if visit.group not in seen_groups:  # contiguous + SDPA backends, timed once per group
                seen_groups.add(visit.group)
                t += call_s * (1 + SDPA_BACKENDS_TIMED * ("sdpa" in spec.baselines))
            linear = (visit.head.name, visit.dtype, visit.batch)
            if visit.head.has_model_dims and linear not in seen_linear:
                seen_linear.add(linear)
                t += call_s
            reference = "reference" in spec.baselines and visit.batch * visit.context <= spec.reference_max_tokens
            t += len(visit.block_sizes) * (call_s + reference * eager_s)
            t += TRITON_COMPILE_S * sum(1 for _ in _variants(spec, visit, seen_variants))
        out[visit.phase] = out.get(visit.phase, 0.0) + t
    out["total"] = sum(out.values())
    return out


def describe(spec: KernelBenchSpec, visits: list[Visit]) -> str:
    """The point list by phase and the time estimate, as printed by ``--plan``."""
    est = estimate_s(spec, visits)
    lines = [f"bandwidth ceilings (copy, read): estimate {est['ceilings']:.0f} s"]
    for phase in PHASES:
        mine = [v for v in visits if v.phase == phase]
        if not mine:
            continue
        points = sum(len(v.block_sizes) for v in mine)
        lines.append(f"phase {phase}: {points} points in {len(mine)} visits, estimate {est[phase]:.0f} s")
        for v in mine:
            lines.append(f"  {v.head.name} {v.dtype} batch {v.batch} context {v.context} "
                         f"block {','.join(map(str, v.block_sizes))}")
    lines.append(f"total estimate {est['total']:.0f} s (CUDA; priors in kernels/bench_plan.py)")
    return "\n".join(lines)
