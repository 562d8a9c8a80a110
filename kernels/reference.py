"""Torch implementations of the kernels: the oracle of the tests and the CPU execution path.

Attention here gathers each sequence's keys and values through its block table (or its
contiguous slot range), then runs dense softmax attention for the one query token. It
loops over sequences, so memory stays at one sequence's keys, and it reads exactly the
slots the kernels may read: tokens ``[max(0, L - window), L)`` of a sequence of length L.

Semantics shared with the Triton kernels (tests hold them to it):

* the query is the token at position ``L - 1``; key ``j`` is visible when ``j < L`` and,
  with a sliding window ``w``, when ``j >= L - w`` (the last ``w`` tokens, query included);
* ALiBi adds ``slope[h] * (j - (L - 1))`` to the scaled score of head ``h``;
* a sequence with ``L == 0`` gets an all-zero output.

``compute_dtype`` is float32 for the engine and float64 in the tests; the output has
``out_dtype`` (default: the dtype of ``q``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import torch

if TYPE_CHECKING:
    from typing_extensions import Unpack


def _attend_one(
    q: torch.Tensor,  # [num_heads, head_dim]
    keys: torch.Tensor,  # [n, num_kv_heads, head_dim]
    values: torch.Tensor,  # [n, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [n] token positions of keys
    context_len: int,
    scale: float,
    alibi_slopes: torch.Tensor | None,  # [num_heads]
    compute_dtype: torch.dtype,
) -> torch.Tensor:  # [num_heads, head_dim] in compute_dtype
    num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    qg = q.to(compute_dtype).view(num_kv_heads, group, head_dim)
    k = keys.to(compute_dtype)
    v = values.to(compute_dtype)
    scores = torch.einsum("kgd,nkd->kgn", qg, k) * scale  # [kv_heads, group, n]
    if alibi_slopes is not None:
        rel = (positions - (context_len - 1)).to(compute_dtype)  # [n], <= 0
        slopes = alibi_slopes.to(compute_dtype).view(num_kv_heads, group, 1)
        scores = scores + slopes * rel
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("kgn,nkd->kgd", probs, v)
    return out.reshape(num_heads, head_dim)


def _visible_positions(context_len: int, sliding_window: int | None, device) -> torch.Tensor:
    start = max(0, context_len - sliding_window) if sliding_window is not None else 0
    return torch.arange(start, context_len, device=device)


class DecodeOptions(TypedDict, total=False):
    """Keyword options of the decode references (defaults: ``_decode``'s)."""

    scale: float | None  # default 1 / sqrt(head_dim)
    sliding_window: int | None
    alibi_slopes: torch.Tensor | None  # [num_heads]
    compute_dtype: torch.dtype
    out_dtype: torch.dtype | None  # default: q's dtype


def _decode(q, k_slots, v_slots, slot_of, context_lens, *, scale=None, sliding_window=None,
            alibi_slopes=None, compute_dtype=torch.float32, out_dtype=None):
    """Shared loop: ``slot_of(seq, positions) -> index tuple`` into the caches."""
    num_seqs, num_heads, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out = torch.zeros(num_seqs, num_heads, head_dim, dtype=compute_dtype, device=q.device)
    lens = context_lens.tolist()
    for seq, context_len in enumerate(lens):
        if context_len <= 0:
            continue
        positions = _visible_positions(context_len, sliding_window, q.device)
        index = slot_of(seq, positions)
        out[seq] = _attend_one(q[seq], k_slots[index], v_slots[index], positions, context_len,
                               scale, alibi_slopes, compute_dtype)
    return out.to(out_dtype or q.dtype)


def paged_decode_attention_reference(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks]
    context_lens: torch.Tensor,  # [num_seqs]
    **options: Unpack[DecodeOptions],
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Decode attention through a block table, in ``compute_dtype`` (see module doc)."""
    block_size = k_cache.shape[1]
    tables = block_tables.long()

    def slot_of(seq: int, positions: torch.Tensor):
        return tables[seq, positions // block_size], positions % block_size

    return _decode(q, k_cache, v_cache, slot_of, context_lens, **options)


def contiguous_decode_attention_reference(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    seq_starts: torch.Tensor,  # [num_seqs] first slot of each sequence
    context_lens: torch.Tensor,  # [num_seqs]
    **options: Unpack[DecodeOptions],
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Decode attention over a contiguous cache: sequence ``s`` token ``j`` is slot ``start[s] + j``."""
    starts = seq_starts.long().tolist()

    def slot_of(seq: int, positions: torch.Tensor):
        return (positions + starts[seq],)

    return _decode(q, k_cache, v_cache, slot_of, context_lens, **options)


# ---- cache writes, block copies, swaps ---------------------------------------------------


def write_kv_cache_reference(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # paged [num_blocks, block_size, H, D] or contiguous [num_slots, H, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens]; negative = skip (padding token)
) -> None:
    """Store token ``i``'s K/V at slot ``slot_mapping[i]`` (``block * block_size + offset``)."""
    slots = slot_mapping.long()
    keep = slots >= 0
    slots, key, value = slots[keep], key[keep], value[keep]
    if k_cache.dim() == 4:
        block_size = k_cache.shape[1]
        index = (slots // block_size, slots % block_size)
    else:
        index = (slots,)
    k_cache[index] = key.to(k_cache.dtype)
    v_cache[index] = value.to(v_cache.dtype)


def copy_blocks_reference(cache: torch.Tensor, pairs: Sequence[tuple[int, int]] | torch.Tensor) -> None:
    """``cache[dst] = cache[src]`` for each (src, dst) pair (copy-on-write)."""
    pairs_t = torch.as_tensor(pairs, dtype=torch.long).reshape(-1, 2).to(cache.device)
    if pairs_t.numel():
        cache[pairs_t[:, 1]] = cache[pairs_t[:, 0]]


def gather_blocks_reference(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """The blocks ``cache[block_ids]`` as one contiguous tensor [n, *block_shape]."""
    return cache[block_ids.long().to(cache.device)].contiguous()


def scatter_blocks_reference(cache: torch.Tensor, block_ids: torch.Tensor, blocks: torch.Tensor) -> None:
    """``cache[block_ids[i]] = blocks[i]``."""
    cache[block_ids.long().to(cache.device)] = blocks.to(device=cache.device, dtype=cache.dtype)
