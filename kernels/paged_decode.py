"""Paged decode attention (PagedAttention): one query token per sequence, K/V in blocks.

Layout::

    q            [num_seqs, num_heads, head_dim]
    k/v_cache    [num_blocks, block_size, num_kv_heads, head_dim]   (one layer)
    block_tables [num_seqs, max_blocks]  int32: logical block i of seq s is block_tables[s, i]
    context_lens [num_seqs]              tokens in the cache per sequence (query token included)

The kernel (``_decode_kernel``) is shared with ``pagebench.kernels.contiguous_decode``: a constexpr
``PAGED`` picks the only lines that differ, how token ``j`` of a sequence becomes a cache
row (``table[j // block_size] * block_size + j % block_size`` vs ``start + j``). Everything
else -- tiling, softmax, split-K, launch configuration -- is literally the same code, which
is what makes the pair a controlled experiment for the cost of the indirection.

Algorithm, per program = (sequence, KV head [, chunk of its query heads], split):

* GQA: the program holds all query heads of one KV head as the rows of a [BLOCK_M, D]
  tile (padded to >= 16 rows for ``tl.dot``), so every K/V tile is loaded once for the
  whole group (MHA: group 1, MQA: group = num_heads). Groups larger than BLOCK_M (64, or
  32 at head_dim 256) are split in chunks that each re-read K/V.
* Keys are walked in tiles of ``TILE_N`` tokens (a fixed config, see
  ``pagebench.kernels.decode_plan``); the block ids are loaded once per block and a tile ahead, full
  tiles run unmasked and the last partial tile is peeled (``pagebench.kernels.decode_kernel``).
* Online softmax in fp32 with exp2 (scale folded with log2 e); ``p`` is cast to the V
  dtype for the second ``tl.dot`` (fp32 inputs use IEEE fp32 dots, not TF32).
* Head dims that are not powers of two are padded to the next one and masked.
* Split-K (flash-decoding): with ``num_splits > 1`` each program covers a contiguous range
  of tiles of its sequence and writes an unnormalised partial output with its running max
  and sum; ``_reduce_splits_kernel`` combines them (an online softmax over the splits, 16
  heads per program).

Split heuristic (``pagebench.kernels.decode_plan.choose_num_splits``): the split count that minimises
the wave-quantised time on ``SMs x resident CTAs per SM`` slots, no split shorter than one
tile, at most 64. The context bound is ``max_blocks * block_size`` (known on the host
without a device sync) unless ``max_context_len=`` is given. ``num_splits=`` forces a value
(tests, benchmarks).

CPU tensors run the torch reference unless the Triton interpreter is active
(``TRITON_INTERPRET=1`` before triton is imported; see ``pagebench.kernels._runtime``); the engine's
CPU executor relies on this.
"""

from __future__ import annotations

import math

import torch
import triton

from pagebench.kernels import _runtime as rt
from pagebench.kernels.decode_kernel import _decode_kernel, _reduce_splits_kernel
from pagebench.kernels.decode_plan import launch_plan
from pagebench.kernels.reference import paged_decode_attention_reference

MAX_HEAD_DIM = 256
MAX_BLOCK_SIZE = 256


def decode_launch(q, k_cache, v_cache, index, context_lens, out, *, paged: bool, block_size: int,
                  scale: float, sliding_window: int | None, alibi_slopes: torch.Tensor | None,
                  num_splits: int | None, max_context: int, tile_size: int | None,
                  num_stages: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """Launch the shared kernel (and the split reduction). Inputs are already validated.

    Tile / stages / warps not given come from ``decode_plan.select_config`` (the same on every
    call: no autotuning); ``last_kernel_config()`` says which config ran.

    ``k_cache``/``v_cache`` strides: paged [block, token, head, dim]; contiguous
    [slot, head, dim] -- the contiguous layout passes stride 0 for the token-in-block axis.
    """
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[-2]
    device = q.device
    plan = launch_plan(num_seqs, num_heads, num_kv_heads, head_dim, max_context=max_context, sms=rt.num_sms(device),
                       itemsize=q.element_size(), num_splits=num_splits, tile_size=tile_size,
                       num_stages=num_stages, num_warps=num_warps)
    head_dim_pad, num_splits = plan.head_dim_pad, plan.num_splits
    if num_seqs == 0:
        return out
    split = num_splits > 1
    # NOTE: Triton's interpreter multiplies bf16 dot operands wrongly (3.x); there the bf16
    # values are upcast to fp32 before the dots -- the same products, fp32 accumulation.
    dot_upcast = q.dtype == torch.bfloat16 and device.type == "cpu" and rt.interpreter_active()
    if split:
        part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim_pad, dtype=torch.float32, device=device)
        part_m = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=device)
        part_l = torch.empty_like(part_m)
    else:
        part_out = part_m = part_l = out  # never touched: SPLIT is a constexpr
    if paged:
        stride_kb, stride_kt, stride_kh = k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)
        stride_vb, stride_vt, stride_vh = v_cache.stride(0), v_cache.stride(1), v_cache.stride(2)
        stride_index = index.stride(0)
    else:
        stride_kb, stride_kt, stride_kh = k_cache.stride(0), 0, k_cache.stride(1)
        stride_vb, stride_vt, stride_vh = v_cache.stride(0), 0, v_cache.stride(1)
        stride_index = 0
    global _LAST_CONFIG
    _decode_kernel[plan.grid(num_seqs, num_kv_heads)](
        out, q, k_cache, v_cache, index, context_lens,
        alibi_slopes if alibi_slopes is not None else q,
        part_out, part_m, part_l,
        scale * 1.4426950408889634,
        sliding_window or 0, num_splits, num_heads,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_index,
        QUERY_GROUP=num_heads // num_kv_heads, HEAD_CHUNKS=plan.head_chunks, BLOCK_M=plan.block_m,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_SIZE=block_size, PAGED=paged, USE_WINDOW=sliding_window is not None,
        USE_ALIBI=alibi_slopes is not None, SPLIT=split,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or dot_upcast else "tf32", DOT_UPCAST=dot_upcast,
        ROW_ALIGN=math.gcd(stride_kb, stride_kt, stride_vb, stride_vt, 16) or 16,
        TILE_N=plan.config.tile_n, num_warps=plan.config.num_warps, num_stages=plan.config.num_stages,
    )
    _LAST_CONFIG = plan.config.as_dict()
    if split:
        block_h = min(rt.next_pow2(num_heads), 16)
        _reduce_splits_kernel[(num_seqs, triton.cdiv(num_heads, block_h))](
            out, part_out, part_m, part_l, num_splits, num_heads, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_H=block_h, num_warps=4,
        )
    return out


_LAST_CONFIG: dict | None = None


def last_kernel_config() -> dict | None:
    """``{"tile_n", "num_warps", "num_stages"}`` of the last decode launch (None before one)."""
    return _LAST_CONFIG


# ---- validation shared with contiguous_decode --------------------------------------------


def validate_decode_common(q, k_cache, v_cache, context_lens, *, cache_ndim: int, scale,
                           sliding_window, alibi_slopes, num_splits, tile_size, out, num_stages=None,
                           num_warps=None):
    """Checks both decode wrappers share; returns (device, scale, alibi_slopes as fp32)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must be [num_seqs, num_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != cache_ndim:
        layout = ("[num_blocks, block_size, num_kv_heads, head_dim]" if cache_ndim == 4
                  else "[num_slots, num_kv_heads, head_dim]")
        raise ValueError(f"k_cache must be {layout}, got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}")
    rt.check_float_dtype("q", q)
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"q, k_cache and v_cache must share one dtype, got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[-2]
    if k_cache.shape[-1] != head_dim:
        raise ValueError(f"head_dim of q ({head_dim}) != head_dim of the cache ({k_cache.shape[-1]})")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in 1..{MAX_HEAD_DIM}, got {head_dim}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must be contiguous in head_dim (stride(-1) == 1)")
    rt.check_index_tensor("context_lens", context_lens, 1)
    if context_lens.shape[0] != num_seqs:
        raise ValueError(f"context_lens has {context_lens.shape[0]} entries for {num_seqs} sequences")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or tuple(alibi_slopes.shape) != (num_heads,):
            raise ValueError(f"alibi_slopes must be a tensor of shape [num_heads={num_heads}]")
        alibi_slopes = alibi_slopes.to(torch.float32).contiguous()
    device = rt.check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, context_lens=context_lens,
                                  alibi_slopes=alibi_slopes, out=out)
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                       or sliding_window < 1):
        raise ValueError(f"sliding_window must be None or a positive int, got {sliding_window!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    elif not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    if num_splits is not None and not (isinstance(num_splits, int) and 1 <= num_splits <= 1024):
        raise ValueError(f"num_splits must be None or an int in 1..1024, got {num_splits!r}")
    if tile_size is not None and not (isinstance(tile_size, int) and rt.is_pow2(tile_size)
                                      and 16 <= tile_size <= 256):
        raise ValueError(f"tile_size must be None or a power of two in 16..256, got {tile_size!r}")
    if num_stages is not None and not (isinstance(num_stages, int) and 1 <= num_stages <= 8):
        raise ValueError(f"num_stages must be None or an int in 1..8, got {num_stages!r}")
    if num_warps is not None and num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be None or one of 1, 2, 4, 8, 16, got {num_warps!r}")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(f"out must be a {q.dtype} tensor shaped like q {tuple(q.shape)} with stride(-1) == 1")
    return device, float(scale), alibi_slopes


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    context_lens: torch.Tensor,  # [num_seqs]
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int | None = None,
    max_context_len: int | None = None,
    tile_size: int | None = None,
    num_stages: int | None = None,
    num_warps: int | None = None,
    out: torch.Tensor | None = None,
    backend: rt.Backend = "auto",
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim], dtype of q
    """Attention of each sequence's one query token over its paged K/V cache.

    Args:
        scale: softmax scale; default ``1 / sqrt(head_dim)``.
        sliding_window: attend to the last ``sliding_window`` tokens only (query included).
        alibi_slopes: [num_heads] slopes; adds ``slope * (j - (L - 1))`` to key ``j``'s score.
        num_splits: force the split-K factor (1 = no split); default: the heuristic.
        max_context_len: bound on context_lens for the heuristic; default
            ``max_blocks * block_size`` (no device sync).
        tile_size: tokens per key tile (power of two, 16..256).
        num_stages: software-pipeline depth of the key loop (Triton ``num_stages``).
        num_warps: warps per program. The ones not given are 64 tokens (32 at head_dim >
            128), 3 stages, 4 warps (``pagebench.kernels.decode_plan.select_config``).
        out: optional output buffer shaped like ``q``.
        backend: "auto" | "triton" | "torch", see ``pagebench.kernels._runtime``.

    Raises ValueError on malformed inputs (shapes, dtypes, devices, a block size that is
    not a power of two in 1..256, ...). Context lengths and block ids are range-checked
    for CPU inputs only (checking device tensors would cost a sync).
    """
    device, scale, alibi_slopes = validate_decode_common(
        q, k_cache, v_cache, context_lens, cache_ndim=4, scale=scale, sliding_window=sliding_window,
        alibi_slopes=alibi_slopes, num_splits=num_splits, tile_size=tile_size, out=out, num_stages=num_stages,
        num_warps=num_warps)
    block_size = k_cache.shape[1]
    if not (rt.is_pow2(block_size) and block_size <= MAX_BLOCK_SIZE):
        raise ValueError(f"block_size (k_cache.shape[1]) must be a power of two in 1..{MAX_BLOCK_SIZE}, "
                         f"got {block_size}")
    rt.check_index_tensor("block_tables", block_tables, 2)
    if block_tables.shape[0] != q.shape[0]:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {q.shape[0]} sequences")
    rt.check_same_device(q=q, block_tables=block_tables)
    max_blocks = block_tables.shape[1]
    if device.type == "cpu":
        _check_paged_ranges(block_tables, context_lens, block_size, k_cache.shape[0])
    if rt.resolve_backend(backend, device) == "torch":
        result = paged_decode_attention_reference(
            q, k_cache, v_cache, block_tables, context_lens, scale=scale,
            sliding_window=sliding_window, alibi_slopes=alibi_slopes)
        return out.copy_(result) if out is not None else result
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    max_context = max_context_len if max_context_len is not None else max_blocks * block_size
    return decode_launch(q, k_cache, v_cache, block_tables, context_lens, out, paged=True,
                         block_size=block_size, scale=scale, sliding_window=sliding_window,
                         alibi_slopes=alibi_slopes, num_splits=num_splits, max_context=max_context,
                         tile_size=tile_size, num_stages=num_stages, num_warps=num_warps)


def _check_paged_ranges(block_tables, context_lens, block_size: int, num_blocks: int) -> None:
    lens = context_lens.long()
    max_blocks = block_tables.shape[1]
    if lens.numel() and (int(lens.min()) < 0 or int(lens.max()) > max_blocks * block_size):
        raise ValueError(f"context_lens must be in 0..max_blocks * block_size = {max_blocks * block_size}, "
                         f"got {lens.min().item()}..{lens.max().item()}")
    needed = torch.arange(max_blocks) < (lens[:, None] + block_size - 1) // block_size
    used = block_tables.long()[needed]
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_blocks):
        raise ValueError(f"block_tables refer to block ids outside 0..{num_blocks - 1} within the context")
