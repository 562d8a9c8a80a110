"""Paged decode attention (PagedAttention): one query token per sequence, K/V in blocks.

Layout::

    q            [num_seqs, num_heads, head_dim]
    k/v_cache    [num_blocks, block_size, num_kv_heads, head_dim]   (one layer)
    block_tables [num_seqs, max_blocks]  int32: logical block i of seq s is block_tables[s, i]
    context_lens [num_seqs]              tokens in the cache per sequence (query token included)

The kernel (``_decode_kernel``) is shared with ``kernels.contiguous_decode``: a constexpr
``PAGED`` picks the only lines that differ, how token ``j`` of a sequence becomes a cache
row (``table[j // block_size] * block_size + j % block_size`` vs ``start + j``). Everything
else -- tiling, softmax, split-K, launch configuration -- is literally the same code, which
is what makes the pair a controlled experiment for the cost of the indirection.

Algorithm, per program = (sequence, KV head [, chunk of its query heads], split):

* GQA: the program holds all query heads of one KV head as the rows of a [BLOCK_M, D]
  tile (padded to >= 16 rows for ``tl.dot``), so every K/V tile is loaded once for the
  whole group (MHA: group 1, MQA: group = num_heads). Groups larger than BLOCK_M (64, or
  32 at head_dim 256) are split in chunks that each re-read K/V.
* Keys are walked in tiles of ``TILE_N`` tokens (64; 32 at head_dim > 128). The block
  table is gathered per token, so a tile spans ``TILE_N / block_size`` small blocks (one
  wide load for small pages) or a slice of one large block. The block ids of the next
  tile are loaded one iteration ahead: with them loaded in the same iteration, Triton's
  pipeliner treats K/V as indirect loads and keeps one K/V tile in flight instead of two
  (sm_90: 39 KB vs 70 KB shared memory; ``kernels.compile_check`` shows it).
* Online softmax in fp32 with exp2 (scale folded with log2 e); ``p`` is cast to the V
  dtype for the second ``tl.dot`` (fp32 inputs use IEEE fp32 dots, not TF32).
* Head dims that are not powers of two are padded to the next one and masked.
* Split-K (flash-decoding): with ``num_splits > 1`` each program covers a contiguous range
  of tiles of its sequence and writes an unnormalised partial output with its running max
  and sum; ``_reduce_splits_kernel`` combines them (an online softmax over the splits, 16
  heads per program).

Split heuristic (``choose_num_splits``): splitting only pays when the (sequence, KV head)
grid cannot fill the GPU. If ``programs >= num_SMs`` there is no split; otherwise enough
splits for about two waves (``ceil(2 * SMs / programs)``), but no split shorter than 256
tokens and at most 64. The context bound is ``max_blocks * block_size`` (known on the
host without a device sync) unless ``max_context_len=`` is given. ``num_splits=`` forces
a value (tests, benchmarks).

CPU tensors run the torch reference unless the Triton interpreter is active
(``TRITON_INTERPRET=1`` before triton is imported; see ``kernels._runtime``); the engine's
CPU executor relies on this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import _runtime as rt
from kernels.reference import paged_decode_attention_reference

MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64
MAX_HEAD_DIM = 256
MAX_BLOCK_SIZE = 256
DEFAULT_NUM_STAGES = 3


@triton.jit
def _decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    index_ptr,  # PAGED: block tables [num_seqs, max_blocks]; else seq_starts [num_seqs]
    context_lens_ptr, alibi_slopes_ptr,
    part_out_ptr, part_m_ptr, part_l_ptr,  # [num_seqs, num_heads, num_splits(, HEAD_DIM_PAD)]
    scale_log2,  # softmax scale * log2(e)
    sliding_window, num_splits, num_heads,
    stride_qs, stride_qh, stride_os, stride_oh,
    stride_kb, stride_kt, stride_kh,  # contiguous: stride_kb is the slot stride
    stride_vb, stride_vt, stride_vh,
    stride_index,
    QUERY_GROUP: tl.constexpr, HEAD_CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, TILE_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, PAGED: tl.constexpr, USE_WINDOW: tl.constexpr,
    USE_ALIBI: tl.constexpr, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1) // HEAD_CHUNKS
    chunk = tl.program_id(1) % HEAD_CHUNKS
    split = tl.program_id(2)

    offs_m = chunk * BLOCK_M + tl.arange(0, BLOCK_M)  # index within the query group
    head_mask = offs_m < QUERY_GROUP
    heads = kv_head * QUERY_GROUP + offs_m  # [BLOCK_M] query heads of this program
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    qd_mask = head_mask[:, None] & d_mask[None, :]

    q = tl.load(q_ptr + seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=qd_mask, other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]
    if DOT_UPCAST:
        q = q.to(tl.float32)

    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    first_token = 0
    if USE_WINDOW:
        first_token = tl.maximum(context_len - sliding_window, 0)
    first_tile = first_token // TILE_N
    num_tiles = tl.cdiv(context_len, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles - first_tile, num_splits)
    tile_lo = first_tile + split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    if PAGED:
        table_row = index_ptr + seq.to(tl.int64) * stride_index
    else:
        seq_start = tl.load(index_ptr + seq).to(tl.int64)
    if USE_ALIBI:
        slopes = tl.load(alibi_slopes_ptr + heads, mask=head_mask, other=0.0).to(tl.float32) * 1.4426950408889634
    k_base = k_cache_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_cache_ptr + kv_head.to(tl.int64) * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    if PAGED:
        # NOTE: the block ids of tile t + 1 are loaded during tile t, so K/V addresses never
        # wait on a load of their own iteration and the pipeliner can prefetch K/V tiles as
        # deep as for the contiguous layout.
        offs_next = tile_lo * TILE_N + tl.arange(0, TILE_N)
        next_block = tl.load(table_row + offs_next // BLOCK_SIZE, mask=offs_next < context_len, other=0)
    for tile in range(tile_lo, tile_hi):
        offs_n = tile * TILE_N + tl.arange(0, TILE_N)  # token positions
        in_context = offs_n < context_len
        visible = in_context & (offs_n >= first_token)
        if PAGED:
            block = next_block.to(tl.int64)
            offs_next = offs_n + TILE_N
            next_block = tl.load(table_row + offs_next // BLOCK_SIZE, mask=offs_next < context_len, other=0)
            k_rows = block * stride_kb + (offs_n % BLOCK_SIZE) * stride_kt
            v_rows = block * stride_vb + (offs_n % BLOCK_SIZE) * stride_vt
        else:
            k_rows = (seq_start + offs_n) * stride_kb
            v_rows = (seq_start + offs_n) * stride_vb
        kv_mask = visible[:, None] & d_mask[None, :]
        k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)  # [TILE_N, D]
        if DOT_UPCAST:
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [BLOCK_M, TILE_N]
        if USE_ALIBI:
            rel = (offs_n - (context_len - 1)).to(tl.float32)
            scores += slopes[:, None] * rel[None, :]
        scores = tl.where(visible[None, :], scores, float("-inf"))
        # NOTE: every tile in [tile_lo, tile_hi) holds >= 1 visible token, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        p = p.to(v.dtype)
        if DOT_UPCAST:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    if SPLIT:
        part = (seq.to(tl.int64) * num_heads + heads) * num_splits + split  # [BLOCK_M]
        tl.store(part_m_ptr + part, m_i, mask=head_mask)
        tl.store(part_l_ptr + part, l_i, mask=head_mask)
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM_PAD + offs_d[None, :], acc, mask=head_mask[:, None])
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # context_len == 0 -> zeros
        tl.store(out_ptr + seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=qd_mask)


@triton.jit
def _reduce_splits_kernel(
    out_ptr, part_out_ptr, part_m_ptr, part_l_ptr,
    num_splits, num_heads, stride_os, stride_oh,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Combine the splits of BLOCK_H heads of one sequence: an online softmax over splits."""
    seq = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < num_heads
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    base = (seq.to(tl.int64) * num_heads + offs_h) * num_splits  # [BLOCK_H]
    m_run = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_run = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM_PAD], dtype=tl.float32)
    for split in range(0, num_splits):
        m_s = tl.load(part_m_ptr + base + split, mask=h_mask, other=float("-inf"))
        l_s = tl.load(part_l_ptr + base + split, mask=h_mask, other=0.0)
        acc_s = tl.load(part_out_ptr + (base + split)[:, None] * HEAD_DIM_PAD + offs_d[None, :],
                        mask=h_mask[:, None], other=0.0)
        m_new = tl.maximum(m_run, m_s)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # empty so far: exp2(-inf) = 0, not NaN
        alpha = tl.exp2(m_run - m_ref)
        beta = tl.exp2(m_s - m_ref)
        l_run = l_run * alpha + l_s * beta
        acc = acc * alpha[:, None] + acc_s * beta[:, None]
        m_run = m_new
    out = acc / tl.where(l_run > 0, l_run, 1.0)[:, None]  # context 0 -> zeros
    tl.store(out_ptr + seq.to(tl.int64) * stride_os + offs_h[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=h_mask[:, None] & (offs_d[None, :] < HEAD_DIM))


# ---- launch configuration ---------------------------------------------------------------


def default_tile_size(head_dim: int) -> int:
    return 64 if rt.next_pow2(head_dim) <= 128 else 32


def choose_num_splits(num_seqs: int, kv_programs: int, max_context: int, sms: int) -> int:
    """Split-K factor: see the module docstring (``kv_programs`` = KV heads x head chunks)."""
    programs = num_seqs * kv_programs
    if programs == 0 or programs >= sms:
        return 1
    wanted = -(-2 * sms // programs)
    by_length = max(1, max_context // MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, by_length, MAX_SPLITS))


@dataclass(frozen=True)
class LaunchPlan:
    """How a decode call is cut into programs (shared by the paged and contiguous kernels)."""

    head_dim_pad: int  # head_dim rounded up to a power of two (>= 16)
    block_m: int  # query-head rows per program (>= 16 for tl.dot)
    head_chunks: int  # programs per KV head along its query group
    tile_n: int  # key tokens per loop iteration
    num_splits: int  # split-K factor (1 = no second kernel)
    num_stages: int  # software-pipeline depth of the key loop


def launch_plan(num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int, *, max_context: int,
                device: torch.device, num_splits: int | None = None, tile_size: int | None = None,
                num_stages: int | None = None) -> LaunchPlan:
    """The launch configuration a decode call with these sizes uses (see module docstring)."""
    group = num_heads // num_kv_heads
    head_dim_pad = max(16, rt.next_pow2(head_dim))
    block_m = max(16, min(rt.next_pow2(group), 64 if head_dim_pad <= 128 else 32))
    head_chunks = -(-group // block_m)
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads * head_chunks, max_context, rt.num_sms(device))
    return LaunchPlan(head_dim_pad, block_m, head_chunks, tile_size or default_tile_size(head_dim), num_splits,
                      num_stages or DEFAULT_NUM_STAGES)


def decode_launch(q, k_cache, v_cache, index, context_lens, out, *, paged: bool, block_size: int,
                  scale: float, sliding_window: int | None, alibi_slopes: torch.Tensor | None,
                  num_splits: int | None, max_context: int, tile_size: int | None,
                  num_stages: int | None = None) -> torch.Tensor:
    """Launch the shared kernel (and the split reduction). Inputs are already validated.

    ``k_cache``/``v_cache`` strides: paged [block, token, head, dim]; contiguous
    [slot, head, dim] -- the contiguous layout passes stride 0 for the token-in-block axis.
    """
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[-2]
    device = q.device
    plan = launch_plan(num_seqs, num_heads, num_kv_heads, head_dim, max_context=max_context, device=device,
                       num_splits=num_splits, tile_size=tile_size, num_stages=num_stages)
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
    grid = (num_seqs, num_kv_heads * plan.head_chunks, num_splits)
    _decode_kernel[grid](
        out, q, k_cache, v_cache, index, context_lens,
        alibi_slopes if alibi_slopes is not None else q,
        part_out, part_m, part_l,
        scale * 1.4426950408889634,
        sliding_window or 0, num_splits, num_heads,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_index,
        QUERY_GROUP=num_heads // num_kv_heads, HEAD_CHUNKS=plan.head_chunks, BLOCK_M=plan.block_m,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, TILE_N=plan.tile_n,
        BLOCK_SIZE=block_size, PAGED=paged, USE_WINDOW=sliding_window is not None,
        USE_ALIBI=alibi_slopes is not None, SPLIT=split,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or dot_upcast else "tf32", DOT_UPCAST=dot_upcast,
        num_warps=4, num_stages=plan.num_stages,
    )
    if split:
        block_h = min(rt.next_pow2(num_heads), 16)
        _reduce_splits_kernel[(num_seqs, triton.cdiv(num_heads, block_h))](
            out, part_out, part_m, part_l, num_splits, num_heads, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_H=block_h, num_warps=4,
        )
    return out


# ---- validation shared with contiguous_decode --------------------------------------------


def validate_decode_common(q, k_cache, v_cache, context_lens, *, cache_ndim: int, scale,
                           sliding_window, alibi_slopes, num_splits, tile_size, out, num_stages=None):
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
        tile_size: tokens per key tile (power of two, 16..256); default 64 (32 at head_dim > 128).
        num_stages: software-pipeline depth of the key loop (Triton ``num_stages``); default 3.
        out: optional output buffer shaped like ``q``.
        backend: "auto" | "triton" | "torch", see ``kernels._runtime``.

    Raises ValueError on malformed inputs (shapes, dtypes, devices, a block size that is
    not a power of two in 1..256, ...). Context lengths and block ids are range-checked
    for CPU inputs only (checking device tensors would cost a sync).
    """
    device, scale, alibi_slopes = validate_decode_common(
        q, k_cache, v_cache, context_lens, cache_ndim=4, scale=scale, sliding_window=sliding_window,
        alibi_slopes=alibi_slopes, num_splits=num_splits, tile_size=tile_size, out=out, num_stages=num_stages)
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
                         tile_size=tile_size, num_stages=num_stages)


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
