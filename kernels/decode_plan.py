"""How a decode-attention call is cut into programs: split-K, tiles, warps, pipeline depth.

Shared by ``pagebench.kernels.paged_decode`` and ``pagebench.kernels.contiguous_decode`` (one launch plan for
both, so their timings differ only by the block table).

Split-K (``choose_num_splits``) counts waves. A GPU runs ``SMs x resident CTAs per SM``
programs at once (one wave); ``P`` programs of equal work take ``ceil(P / slots)`` waves, so a grid that
fills 1.2 waves costs as much as two. Splitting every (sequence, KV head) program into
``s`` parts makes ``P * s`` programs of ``ceil(tiles / s)`` tiles each (tiles of the
longest context) plus a fixed ``num_stages - 1`` tiles per program (the pipeline fill:
the first K/V loads of a program overlap no compute):
time ~ ``ceil(P * s / slots) * (ceil(tiles / s) + num_stages - 1)``. The heuristic takes
the ``s`` that minimises it, the smallest on a tie (each split adds a partial write and a
reduction), with no split shorter than ``MIN_TOKENS_PER_SPLIT`` tokens and at most
``MAX_SPLITS``.

Resident CTAs per SM come from ``resident_ctas_per_sm`` on the default config's
registers and shared memory, as ``python -m pagebench.kernels.compile_check`` reports them for
sm_90 (``SM90_DECODE_CTAS_PER_SM``; tests/test_kernel_compile.py recomputes it from the
compiled kernel, so the constant cannot drift from the code).

Tile, warps and pipeline depth: on CUDA ``triton.autotune`` picks one of ``DECODE_CONFIGS``
per (head dim, block size, query group, layout, split, dtype) on the first call of that
shape and reuses it; an explicit ``tile_size`` / ``num_stages`` / ``num_warps`` fixes the
config instead (the rest from ``DEFAULT_CONFIG``). The interpreter always runs a fixed
config (autotuning needs CUDA timings).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from pagebench.kernels import _runtime as rt

MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64


@dataclass(frozen=True)
class KernelConfig:
    """One point of the autotuning space of the decode kernel."""

    tile_n: int  # key tokens per loop iteration
    num_warps: int
    num_stages: int  # software-pipeline depth of the key loop

    def as_dict(self) -> dict:
        return {"tile_n": self.tile_n, "num_warps": self.num_warps, "num_stages": self.num_stages}


# Small on purpose: every config of every tuned shape is compiled and timed once (see the
# budget in benchmarks/gpu/README.md). The first is the default (the untuned kernel).
DECODE_CONFIGS = (
    KernelConfig(64, 4, 3),
    KernelConfig(32, 4, 4),
    KernelConfig(128, 8, 2),
)
DEFAULT_CONFIG = DECODE_CONFIGS[0]
# Bytes of K/V pipeline buffers a config may use (H100/H200: 227 KB of shared memory per
# block, NVIDIA Hopper tuning guide); configs above it are pruned before tuning.
MAX_PIPELINE_BYTES = 160 * 1024

# sm_90 limits (CUDA C programming guide, compute capability 9.0): 65536 registers,
# 228 KB shared memory (1 KB reserved per block), 32 blocks and 64 warps per SM.
SM90 = {"regs": 65536, "smem": 228 * 1024, "smem_reserved": 1024, "blocks": 32, "warps": 64}
# resident_ctas_per_sm(regs, smem, 4) for the default config as compile_check reports it
# for sm_90 (mha-13b-bs16 / gqa-8b-bs16: <= 128 registers, 71680 B shared memory).
SM90_DECODE_CTAS_PER_SM = 3


def resident_ctas_per_sm(registers: int, shared_bytes: int, num_warps: int, limits: dict = SM90) -> int:
    """How many CTAs of a kernel fit on one SM at once (registers, shared memory, warps)."""
    threads = 32 * num_warps
    by_regs = limits["regs"] // (-(-registers // 8) * 8 * threads)  # registers allocated in 8s per thread
    by_smem = limits["smem"] // (shared_bytes + limits["smem_reserved"]) if shared_bytes else limits["blocks"]
    return max(1, min(by_regs, by_smem, limits["blocks"], limits["warps"] // num_warps))


def choose_num_splits(num_seqs: int, kv_programs: int, max_context: int, sms: int,
                      ctas_per_sm: int = SM90_DECODE_CTAS_PER_SM, config: KernelConfig = DEFAULT_CONFIG) -> int:
    """Split-K factor that minimises the wave-quantised time (module docstring)."""
    programs = num_seqs * kv_programs
    tiles = -(-max_context // config.tile_n)
    if programs == 0 or tiles == 0:
        return 1
    slots = sms * ctas_per_sm
    fill = config.num_stages - 1
    most = max(1, min(MAX_SPLITS, max_context // MIN_TOKENS_PER_SPLIT))
    best, best_cost = 1, None
    for splits in range(1, most + 1):
        cost = -(-programs * splits // slots) * (-(-tiles // splits) + fill)
        if best_cost is None or cost < best_cost:
            best, best_cost = splits, cost
    return best


@dataclass(frozen=True)
class LaunchPlan:
    """How a decode call is cut into programs (shared by the paged and contiguous kernels)."""

    head_dim_pad: int  # head_dim rounded up to a power of two (>= 16)
    block_m: int  # query-head rows per program (>= 16 for tl.dot)
    head_chunks: int  # programs per KV head along its query group
    num_splits: int  # split-K factor (1 = no second kernel)
    config: KernelConfig | None  # None: autotuned on CUDA (DECODE_CONFIGS)


def fixed_config(tile_size: int | None, num_stages: int | None, num_warps: int | None) -> KernelConfig:
    return KernelConfig(tile_size or DEFAULT_CONFIG.tile_n, num_warps or DEFAULT_CONFIG.num_warps,
                        num_stages or DEFAULT_CONFIG.num_stages)


def launch_plan(num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int, *, max_context: int,
                device: torch.device, num_splits: int | None = None, tile_size: int | None = None,
                num_stages: int | None = None, num_warps: int | None = None) -> LaunchPlan:
    """The launch configuration a decode call with these sizes uses (see module docstring)."""
    group = num_heads // num_kv_heads
    head_dim_pad = max(16, rt.next_pow2(head_dim))
    block_m = max(16, min(rt.next_pow2(group), 64 if head_dim_pad <= 128 else 32))
    head_chunks = -(-group // block_m)
    tuned = device.type == "cuda" and tile_size is None and num_stages is None and num_warps is None
    config = None if tuned else fixed_config(tile_size, num_stages, num_warps)
    if head_dim_pad > 128 and config is not None and tile_size is None:
        config = KernelConfig(32, config.num_warps, config.num_stages)  # keeps d256 tiles in registers
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads * head_chunks, max_context, rt.num_sms(device))
    return LaunchPlan(head_dim_pad, block_m, head_chunks, num_splits, config)


def prune_configs(configs, named_args, **kwargs):
    """Autotuner hook: drop configs whose K/V pipeline buffers would not fit in shared memory
    (``num_stages - 1`` K and V tiles in flight: compile_check's shared-memory figures)."""
    elt = named_args["q_ptr"].element_size()
    d = kwargs.get("HEAD_DIM_PAD", named_args.get("HEAD_DIM_PAD"))
    kept = [c for c in configs
            if max(1, c.num_stages - 1) * 2 * c.kwargs["TILE_N"] * d * elt <= MAX_PIPELINE_BYTES]
    return kept or [triton.Config({"TILE_N": 16}, num_warps=4, num_stages=2)]  # fp32 at head_dim 256


def autotuned(kernel):
    """``kernel`` under ``triton.autotune`` over ``DECODE_CONFIGS`` (short timing windows)."""
    import triton.testing

    return triton.autotune(
        configs=[triton.Config({"TILE_N": c.tile_n}, num_warps=c.num_warps, num_stages=c.num_stages)
                 for c in DECODE_CONFIGS],
        key=["HEAD_DIM", "BLOCK_SIZE", "QUERY_GROUP", "PAGED", "SPLIT", "USE_WINDOW"],
        prune_configs_by={"early_config_prune": prune_configs},
        do_bench=lambda fn, quantiles: triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles),
    )(kernel)


def chosen_config(tuner) -> dict | None:
    """The config the autotuned kernel ran last (None before its first call)."""
    best = getattr(tuner, "best_config", None)
    if best is None:
        return None
    return KernelConfig(best.kwargs["TILE_N"], best.num_warps, best.num_stages).as_dict()
