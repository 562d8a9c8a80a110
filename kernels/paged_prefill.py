"""Prefill attention over the KV cache: a chunk of query tokens per sequence, keys read in place.

Layout::

    q             [num_tokens, num_heads, head_dim]   the step's prefill rows, chunk after chunk
    k/v_cache     paged: [num_blocks, block_size, num_kv_heads, head_dim]
                  contiguous: [num_slots, num_kv_heads, head_dim]
    index         paged: block tables [num_chunks, max_blocks] int32
                  contiguous: seq_starts [num_chunks] int32 (slot of each sequence's token 0)
    query_starts  [num_chunks + 1] int32: chunk c owns rows query_starts[c] .. query_starts[c+1] - 1
    context_lens  [num_chunks] int32: tokens in the cache through the chunk's last token

Query row ``i`` of a chunk of ``n`` rows is the token at position ``L - n + i``; it sees key
``j`` when ``j <= L - n + i`` and, with a sliding window ``w``, ``j > L - n + i - w``. The
chunk's own keys must be in the cache already (the executor writes them first), so earlier
chunks of a chunked prefill and prefix-cache hits are read from the cache, never recomputed
or gathered into a copy.

The Triton kernel (``_prefill_kernel``): one program per (chunk, tile of ``BLOCK_M`` query
rows, query head). Keys are walked in tiles of ``TILE_N`` tokens from the first one the
tile's earliest row may see to the last one its latest row sees, each tile's rows found
through the block table (``table[j // block_size] * block_size + j % block_size``) or the
start offset (``start + j``); a constexpr ``PAGED`` picks between them, as in the decode
kernel. Online softmax in fp32 with exp2; fp32 inputs use IEEE fp32 dots (fp16/bf16 the
tensor cores' native dots). Keys outside a
tile's visible range are never loaded.

``prefill_attention_reference`` is the torch version (gathers through the same index; the
CPU execution path and the tests' oracle with ``compute_dtype=torch.float64``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pagebench.kernels import _runtime as rt

BLOCK_M = 16  # query rows per program (tl.dot needs >= 16)
MAX_HEAD_DIM = 256


@triton.jit
def _prefill_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, index_ptr, query_starts_ptr, context_lens_ptr,
    scale_log2, sliding_window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_index,
    QUERY_GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    PAGED: tl.constexpr, WINDOWED: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    chunk = tl.program_id(0)
    tile = tl.program_id(1)
    head = tl.program_id(2)
    q0 = tl.load(query_starts_ptr + chunk)
    n = tl.load(query_starts_ptr + chunk + 1) - q0
    if tile * BLOCK_M < n:
        length = tl.load(context_lens_ptr + chunk)
        kv_head = head // QUERY_GROUP
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of the chunk
        row_ok = rows < n
        pos = length - n + rows  # [BLOCK_M] positions of the queries
        d = tl.arange(0, HEAD_DIM_PAD)
        d_ok = d < HEAD_DIM
        q = tl.load(q_ptr + (q0 + rows)[:, None] * stride_qt + head * stride_qh + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]
        if DOT_UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
        first_pos = length - n + tile * BLOCK_M
        end = tl.minimum(length, first_pos + BLOCK_M)  # keys [lo, end) are read
        lo = 0
        if WINDOWED:
            lo = tl.maximum(first_pos - sliding_window + 1, 0)
        if PAGED:
            start_slot = 0
        else:
            start_slot = tl.load(index_ptr + chunk)
        for key0 in range(lo // TILE_N * TILE_N, end, TILE_N):
            j = key0 + tl.arange(0, TILE_N)  # [TILE_N] key positions
            j_ok = (j < end) & (j >= lo)
            if PAGED:
                block = tl.load(index_ptr + chunk * stride_index + j // BLOCK_SIZE, mask=j_ok, other=0)
                k_rows = block.to(tl.int64) * stride_kb + (j % BLOCK_SIZE) * stride_kt
                v_rows = block.to(tl.int64) * stride_vb + (j % BLOCK_SIZE) * stride_vt
            else:
                k_rows = (start_slot + j).to(tl.int64) * stride_kb
                v_rows = (start_slot + j).to(tl.int64) * stride_vb
            kv_mask = j_ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + k_rows[:, None] + kv_head * stride_kh + d[None, :], mask=kv_mask, other=0.0)
            if DOT_UPCAST:
                k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [BLOCK_M, TILE_N]
            visible = (j[None, :] <= pos[:, None]) & j_ok[None, :]
            if WINDOWED:
                visible = visible & (j[None, :] > pos[:, None] - sliding_window)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + v_rows[:, None] + kv_head * stride_vh + d[None, :], mask=kv_mask, other=0.0)
            if DOT_UPCAST:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + (q0 + rows)[:, None] * stride_ot + head * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # paged [num_blocks, block_size, kv_heads, head_dim] | [num_slots, kv_heads, head_dim]
    v_cache: torch.Tensor,
    index: torch.Tensor,  # paged: [num_chunks, max_blocks] int32; contiguous: [num_chunks] int32
    query_starts: torch.Tensor,  # [num_chunks + 1] int32
    context_lens: torch.Tensor,  # [num_chunks] int32
    *,
    max_query_len: int,
    scale: float | None = None,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    backend: rt.Backend = "auto",
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], dtype of q
    """Causal attention of each chunk's queries over its sequence's cached keys (module doc).

    ``max_query_len`` bounds the rows of a chunk (sizes the grid without a device sync).
    """
    paged = k_cache.dim() == 4
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[-2]
    if num_heads % num_kv_heads or head_dim > MAX_HEAD_DIM or k_cache.shape[-1] != head_dim:
        raise ValueError(f"q {tuple(q.shape)} does not fit the cache {tuple(k_cache.shape)} "
                         f"(heads a multiple of KV heads, head_dim <= {MAX_HEAD_DIM})")
    rt.check_float_dtype("q", q)
    rt.check_index_tensor("index", index, 2 if paged else 1)
    rt.check_index_tensor("query_starts", query_starts, 1)
    rt.check_index_tensor("context_lens", context_lens, 1)
    device = rt.check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, index=index,
                                  query_starts=query_starts, context_lens=context_lens)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.empty_like(q) if out is None else out
    if rt.resolve_backend(backend, device) == "torch":
        out.copy_(prefill_attention_reference(q, k_cache, v_cache, index, query_starts, context_lens,
                                              scale=scale, sliding_window=sliding_window))
        return out
    num_chunks = context_lens.shape[0]
    if num_chunks == 0 or num_tokens == 0:
        return out
    for name, t in (("q", q), ("out", out), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    block_size = k_cache.shape[1] if paged else 1
    tile_n = 64 if head_dim <= 128 else 32
    # NOTE: Triton's interpreter multiplies bf16 dot operands wrongly (3.x), as the decode
    # kernel notes; there bf16 values are upcast to fp32 before the dots.
    dot_upcast = q.dtype == torch.bfloat16 and device.type == "cpu" and rt.interpreter_active()
    grid = (num_chunks, triton.cdiv(max_query_len, BLOCK_M), num_heads)
    _prefill_kernel[grid](
        out, q, k_cache, v_cache, index, query_starts, context_lens,
        scale * 1.4426950408889634, sliding_window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1) if paged else 0, k_cache.stride(-2),
        v_cache.stride(0), v_cache.stride(1) if paged else 0, v_cache.stride(-2),
        index.stride(0) if paged else 0,
        QUERY_GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, rt.next_pow2(head_dim)), BLOCK_M=BLOCK_M, TILE_N=tile_n,
        BLOCK_SIZE=block_size, PAGED=paged, WINDOWED=sliding_window is not None,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or dot_upcast else "tf32",
        DOT_UPCAST=dot_upcast,
    )
    return out


def prefill_attention_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, index: torch.Tensor,
    query_starts: torch.Tensor, context_lens: torch.Tensor, *, scale: float,
    sliding_window: int | None = None, compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], dtype of q
    """The same attention in torch: each chunk's keys gathered through ``index``, one chunk at a time."""
    paged = k_cache.dim() == 4
    num_heads, head_dim = q.shape[1], q.shape[2]
    flat_k = k_cache.reshape(-1, *k_cache.shape[-2:])  # [slots, kv_heads, head_dim]
    flat_v = v_cache.reshape(-1, *v_cache.shape[-2:])
    block_size = k_cache.shape[1] if paged else 1
    out = torch.empty_like(q)
    starts, lens = query_starts.tolist(), context_lens.tolist()
    for c, length in enumerate(lens):
        r0, r1 = starts[c], starts[c + 1]
        n = r1 - r0
        if n == 0:
            continue
        lo = max(0, length - n - sliding_window + 1) if sliding_window is not None else 0
        keys = torch.arange(lo, length, device=q.device)  # [m] positions read
        if paged:
            slots = index[c].long()[keys // block_size] * block_size + keys % block_size
        else:
            slots = index[c].long() + keys
        k = flat_k.index_select(0, slots).to(compute_dtype)  # [m, kv_heads, head_dim]
        v = flat_v.index_select(0, slots).to(compute_dtype)
        group = num_heads // k.shape[1]
        qc = q[r0:r1].to(compute_dtype).view(n, k.shape[1], group, head_dim)
        scores = torch.einsum("tkgd,mkd->kgtm", qc, k) * scale  # [kv_heads, group, n, m]
        pos = torch.arange(length - n, length, device=q.device)[:, None]  # [n, 1]
        visible = keys[None, :] <= pos
        if sliding_window is not None:
            visible &= keys[None, :] > pos - sliding_window
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[r0:r1] = torch.einsum("kgtm,mkd->tkgd", probs, v).reshape(n, num_heads, head_dim).to(q.dtype)
    return out
