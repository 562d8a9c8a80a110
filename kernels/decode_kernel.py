"""The Triton decode-attention kernel shared by the paged and contiguous wrappers.

``_decode_kernel`` runs one program per (sequence, KV head [, chunk of its query heads],
split), with the KV head's query heads as the rows of its ``tl.dot`` operand, so K/V is
read once per query group; a constexpr ``PAGED`` picks how token ``j`` becomes a cache
row: through the block table (``table[j // block_size] * block_size + j % block_size``) or ``start + j``.
Everything else -- tiles, softmax, split-K -- is the same code, which makes the pair a
controlled experiment for the cost of the indirection. See ``pagebench.kernels.paged_decode`` for
the algorithm and ``pagebench.kernels.decode_plan`` for the launch configuration.

Key loop, per tile of ``TILE_N`` tokens:

* Block ids are loaded once per block: a tile spans ``TILE_N // BLOCK_SIZE`` blocks (one
  vector load of that many ids, each broadcast to its ``BLOCK_SIZE`` tokens) or lies inside
  one block (one scalar load). The ids of tile ``t + 1`` are loaded during tile ``t``, so
  K/V addresses never wait on a load of their own iteration and the pipeliner prefetches
  K/V as deep as for the contiguous layout.
* Full tiles run without masks (a head-dim mask only when head_dim is padded); the last,
  partial tile of a split is peeled into a masked loop of at most one iteration. With a
  sliding window every tile is masked (the window's first tile is partial).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_block_ids(table_row, tile, used_blocks, TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Block ids of a tile: [TILE_N // BLOCK_SIZE] ids, or the one block holding the tile."""
    if BLOCK_SIZE < TILE_N:
        idx = tile * (TILE_N // BLOCK_SIZE) + tl.arange(0, TILE_N // BLOCK_SIZE)
        ids = tl.load(table_row + idx, mask=idx < used_blocks, other=0)
    else:
        idx = (tile * TILE_N) // BLOCK_SIZE
        ids = tl.load(table_row + idx, mask=idx < used_blocks, other=0)
    return ids.to(tl.int64)


@triton.jit
def _tile_rows(ids, tile, stride_b, stride_t, TILE_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
               ROW_ALIGN: tl.constexpr):
    """[TILE_N] element offsets of a tile's tokens from their block ids (broadcast per block).

    NOTE: Triton 3.6's alignment analysis forgets what it knew of a tensor it reshapes;
    without ``multiple_of`` (every row offset is a multiple of ROW_ALIGN elements, the gcd
    of the strides, computed on the host) K/V would move in 2-byte loads, unpipelined."""
    if BLOCK_SIZE < TILE_N:
        rows = ids[:, None] * stride_b + tl.arange(0, BLOCK_SIZE)[None, :] * stride_t  # [blocks, BLOCK_SIZE]
        rows = tl.multiple_of(tl.reshape(rows, [TILE_N]), ROW_ALIGN)
    else:
        rows = ids * stride_b + ((tile * TILE_N) % BLOCK_SIZE + tl.arange(0, TILE_N)) * stride_t
    return rows


@triton.jit
def _attend_tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, offs_n, context_len, first_token, d_mask, slopes,
                 scale_log2, MASKED: tl.constexpr, EVEN_D: tl.constexpr, USE_ALIBI: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """One tile of the online softmax; ``MASKED`` for tiles that hold invisible tokens."""
    if MASKED:
        visible = (offs_n < context_len) & (offs_n >= first_token)
        kv_mask = visible[:, None] & d_mask[None, :]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)  # [TILE_N, D]
    elif EVEN_D:
        k = tl.load(k_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_mask[None, :], other=0.0)
    if DOT_UPCAST:
        k = k.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [BLOCK_M, TILE_N]
    if USE_ALIBI:
        rel = (offs_n - (context_len - 1)).to(tl.float32)
        scores += slopes[:, None] * rel[None, :]
    if MASKED:
        scores = tl.where(visible[None, :], scores, float("-inf"))
    # NOTE: every tile a split visits holds >= 1 visible token, so m_new is finite.
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if MASKED:
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    elif EVEN_D:
        v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
    p = p.to(v.dtype)
    if DOT_UPCAST:
        p = p.to(tl.float32)
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


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
    ROW_ALIGN: tl.constexpr,  # every paged row offset is a multiple of this (gcd of the strides)
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
    if USE_WINDOW:
        full_hi = tile_hi  # every tile masked: the window's first tile is partial
    else:
        full_hi = tl.minimum(tile_hi, context_len // TILE_N)

    slopes = tl.zeros([BLOCK_M], dtype=tl.float32)
    if USE_ALIBI:
        slopes = tl.load(alibi_slopes_ptr + heads, mask=head_mask, other=0.0).to(tl.float32) * 1.4426950408889634
    k_base = k_cache_ptr + kv_head.to(tl.int64) * stride_kh + offs_d[None, :]
    v_base = v_cache_ptr + kv_head.to(tl.int64) * stride_vh + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    if PAGED:
        table_row = index_ptr + seq.to(tl.int64) * stride_index
        used_blocks = tl.cdiv(context_len, BLOCK_SIZE)
        next_ids = _tile_block_ids(table_row, tile_lo, used_blocks, TILE_N, BLOCK_SIZE)
    else:
        seq_start = tl.load(index_ptr + seq).to(tl.int64)
    for tile in range(tile_lo, full_hi):
        offs_n = tile * TILE_N + tl.arange(0, TILE_N)  # token positions
        if PAGED:
            ids = next_ids
            next_ids = _tile_block_ids(table_row, tile + 1, used_blocks, TILE_N, BLOCK_SIZE)
            k_rows = _tile_rows(ids, tile, stride_kb, stride_kt, TILE_N, BLOCK_SIZE, ROW_ALIGN)
            v_rows = _tile_rows(ids, tile, stride_vb, stride_vt, TILE_N, BLOCK_SIZE, ROW_ALIGN)
        else:
            k_rows = (seq_start + offs_n) * stride_kb
            v_rows = (seq_start + offs_n) * stride_vb
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k_base + k_rows[:, None], v_base + v_rows[:, None],
                                     offs_n, context_len, first_token, d_mask, slopes, scale_log2,
                                     USE_WINDOW, HEAD_DIM == HEAD_DIM_PAD, USE_ALIBI, DOT_PRECISION, DOT_UPCAST)
    # The peeled last tile: partial, masked; present only in the split that ends the sequence.
    for tile in range(tl.maximum(full_hi, tile_lo), tile_hi):
        offs_n = tile * TILE_N + tl.arange(0, TILE_N)
        if PAGED:
            ids = _tile_block_ids(table_row, tile, used_blocks, TILE_N, BLOCK_SIZE)
            k_rows = _tile_rows(ids, tile, stride_kb, stride_kt, TILE_N, BLOCK_SIZE, ROW_ALIGN)
            v_rows = _tile_rows(ids, tile, stride_vb, stride_vt, TILE_N, BLOCK_SIZE, ROW_ALIGN)
        else:
            k_rows = (seq_start + offs_n) * stride_kb
            v_rows = (seq_start + offs_n) * stride_vb
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k_base + k_rows[:, None], v_base + v_rows[:, None],
                                     offs_n, context_len, first_token, d_mask, slopes, scale_log2,
                                     True, HEAD_DIM == HEAD_DIM_PAD, USE_ALIBI, DOT_PRECISION, DOT_UPCAST)

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
