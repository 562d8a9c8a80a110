"""How a decode-attention call is cut into programs: split-K, tiles, warps, pipeline depth.

Shared by ``pagebench.kernels.paged_decode`` and ``pagebench.kernels.contiguous_decode`` (one launch plan for
both, so their timings differ only by the block table). Every choice here is a pure
function of the call's sizes and the device's SM count: the same call always launches the
same programs (no autotuning on the first call, no timing inside a timed run).

Grid: one program per (sequence, KV head [, chunk of its query group], split). A program
holds all query heads of its KV head as the rows of one ``tl.dot`` operand (padded to 16
rows), so each K/V tile is read from memory once per query group -- GQA reads a quarter
(llama-3-8b: 32 query heads on 8 KV heads) of what one program per query head would.

Split-K (``choose_num_splits``) counts waves. A GPU runs ``SMs x resident CTAs per SM``
programs at once (one wave); ``P`` programs of equal work take ``ceil(P / slots)`` waves, so a grid that
fills 1.2 waves costs as much as two. Splitting every (sequence, KV head) program into
``s`` parts makes ``P * s`` programs of ``ceil(tiles / s)`` tiles each (tiles of the
longest context) plus a fixed ``num_stages - 1`` tiles per program (the pipeline fill:
the first K/V loads of a program overlap no compute):
time ~ ``ceil(P * s / slots) * (ceil(tiles / s) + num_stages - 1)``. The heuristic takes
the ``s`` that minimises it, the smallest on a tie (each split adds a partial write and a
reduction), with no split shorter than one tile and at most ``MAX_SPLITS``. At batch 1-8
this fills the SMs: llama-3-8b at batch 1, context 1024 has 8 (sequence, KV head) programs
of 16 tiles; 16 splits of one tile make 128 programs on the H200's 132 SMs, where the
former floor of 256 tokens per split allowed 4 (32 programs, a quarter of the SMs).

Resident CTAs per SM come from ``resident_ctas_per_sm`` on the default config's
registers and shared memory, as ``python -m pagebench.kernels.compile_check`` reports them for
sm_90 (``SM90_DECODE_CTAS_PER_SM``; tests/test_kernel_compile.py recomputes it from the
compiled kernel, so the constant cannot drift from the code).

Tile, warps and pipeline depth: ``DEFAULT_CONFIG`` (tile 64, 4 warps, 3 stages) unless the
caller fixes them. It is the config Triton's autotuner picked at 164 of the 168 points of
the first H200 run (benchmarks/gpu/2026-12-04-h200, call1/kernels/kernel_results.json,
``paged_config``); the other 4 were t32/w4/s4 at MHA batch 8 and 64, context 1024, where
both configs measured 0.322-0.325 ms at batch 64. (The autotuner also gave the
contiguous control t128/w8/s2 for MHA while the paged kernel ran t64/w4/s3: the pair was not
the same kernel; a fixed config makes it one again.) Head dims above 128
take 32-token tiles (the d256 tiles stay in registers); a config whose K/V pipeline would
not fit in shared memory (fp32 at head_dim 256) falls back to ``FALLBACK_CONFIG``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from pagebench.kernels import _runtime as rt

MAX_SPLITS = 64


@dataclass(frozen=True)
class KernelConfig:
    """Tile, warps and pipeline depth of one decode launch."""

    tile_n: int  # key tokens per loop iteration
    num_warps: int
    num_stages: int  # software-pipeline depth of the key loop

    def as_dict(self) -> dict:
        return {"tile_n": self.tile_n, "num_warps": self.num_warps, "num_stages": self.num_stages}


# The configs a caller may fix (tile_size / num_warps / num_stages); every one is compiled
# for sm_90 by compile_check and tested against the reference. The first is the default.
DECODE_CONFIGS = (
    KernelConfig(64, 4, 3),
    KernelConfig(32, 4, 4),
    KernelConfig(128, 8, 2),
)
DEFAULT_CONFIG = DECODE_CONFIGS[0]
FALLBACK_CONFIG = KernelConfig(16, 4, 2)  # fp32 at head_dim 256: 2 x 16 x 256 x 4 B in flight
# Bytes of K/V pipeline buffers a config may use (H100/H200: 227 KB of shared memory per
# block, NVIDIA Hopper tuning guide); an unfixed default above it takes FALLBACK_CONFIG.
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
    most = max(1, min(MAX_SPLITS, tiles))
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
    block_m: int  # query-head rows per program: the whole query group, >= 16 for tl.dot
    head_chunks: int  # programs per KV head along its query group (1 unless the group > 64 rows)
    num_splits: int  # split-K factor (1 = no second kernel)
    config: KernelConfig

    def grid(self, num_seqs: int, num_kv_heads: int) -> tuple[int, int, int]:
        """Programs per axis: (sequences, KV heads x chunks, splits); K/V is read once per program."""
        return (num_seqs, num_kv_heads * self.head_chunks, self.num_splits)


def pipeline_bytes(config: KernelConfig, head_dim_pad: int, itemsize: int) -> int:
    """Shared memory of a config's K/V pipeline: ``num_stages - 1`` K and V tiles in flight."""
    return max(1, config.num_stages - 1) * 2 * config.tile_n * head_dim_pad * itemsize


def select_config(head_dim_pad: int, itemsize: int, tile_size: int | None = None, num_stages: int | None = None,
                  num_warps: int | None = None) -> KernelConfig:
    """The config of a launch: the caller's values, the rest from ``DEFAULT_CONFIG`` (32-token
    tiles above head_dim 128); ``FALLBACK_CONFIG`` when an unfixed default would overflow
    ``MAX_PIPELINE_BYTES``. Deterministic: a function of its arguments only."""
    config = KernelConfig(tile_size or (DEFAULT_CONFIG.tile_n if head_dim_pad <= 128 else 32),
                          num_warps or DEFAULT_CONFIG.num_warps, num_stages or DEFAULT_CONFIG.num_stages)
    fixed = tile_size is not None or num_stages is not None
    if not fixed and pipeline_bytes(config, head_dim_pad, itemsize) > MAX_PIPELINE_BYTES:
        return KernelConfig(FALLBACK_CONFIG.tile_n, num_warps or FALLBACK_CONFIG.num_warps, FALLBACK_CONFIG.num_stages)
    return config


@lru_cache(maxsize=4096)
def launch_plan(num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int, *, max_context: int,
                sms: int, itemsize: int = 2, num_splits: int | None = None, tile_size: int | None = None,
                num_stages: int | None = None, num_warps: int | None = None) -> LaunchPlan:
    """The launch configuration a decode call with these sizes uses on a device with ``sms``
    streaming multiprocessors (``rt.num_sms``; 1 on CPU). See the module docstring."""
    group = num_heads // num_kv_heads
    head_dim_pad = max(16, rt.next_pow2(head_dim))
    block_m = max(16, min(rt.next_pow2(group), 64 if head_dim_pad <= 128 else 32))
    head_chunks = -(-group // block_m)
    config = select_config(head_dim_pad, itemsize, tile_size, num_stages, num_warps)
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads * head_chunks, max_context, sms, config=config)
    return LaunchPlan(head_dim_pad, block_m, head_chunks, num_splits, config)
