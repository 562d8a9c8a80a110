"""Contiguous decode attention: the control for the paged kernel's block-table indirection.

Layout::

    q            [num_seqs, num_heads, head_dim]
    k/v_cache    [num_slots, num_kv_heads, head_dim]   (one layer; an arena of slots)
    seq_starts   [num_seqs]   first slot of each sequence: token j lives at slot start + j
    context_lens [num_seqs]

This is the same Triton kernel as ``pagebench.kernels.paged_decode`` (``_decode_kernel`` with the
constexpr ``PAGED=False``): same tiles, same softmax, same split-K heuristic and launch
configuration. The only difference is the row address of token ``j`` -- ``start + j``
instead of ``table[j // block_size] * block_size + j % block_size`` (with the block ids
read a tile ahead) -- so a timing difference between the two is the cost of the block
table and of scattered blocks.

The split heuristic needs a bound on the context: pass ``max_context_len=`` (the
benchmark passes the same value to both kernels); without it the wrapper reads
``context_lens.max()``, which synchronises with the device.

CPU tensors run the torch reference unless the Triton interpreter is active (see
``pagebench.kernels._runtime``).
"""

from __future__ import annotations

import torch

from pagebench.kernels import _runtime as rt
from pagebench.kernels.paged_decode import decode_launch, validate_decode_common
from pagebench.kernels.reference import contiguous_decode_attention_reference

# The Triton kernel lives in paged_decode.py and is shared; re-exported for discoverability.
from pagebench.kernels.decode_kernel import _decode_kernel, _reduce_splits_kernel  # noqa: F401


def contiguous_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    seq_starts: torch.Tensor,  # [num_seqs] int32/int64
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
    """Attention of each sequence's one query token over its slot range ``[start, start + L)``.

    Keywords as in ``pagebench.kernels.paged_decode.paged_decode_attention``; ``max_context_len``
    defaults to ``context_lens.max()`` (a device sync on GPU tensors).
    """
    device, scale, alibi_slopes = validate_decode_common(
        q, k_cache, v_cache, context_lens, cache_ndim=3, scale=scale, sliding_window=sliding_window,
        alibi_slopes=alibi_slopes, num_splits=num_splits, tile_size=tile_size, out=out, num_stages=num_stages,
        num_warps=num_warps)
    rt.check_index_tensor("seq_starts", seq_starts, 1)
    if seq_starts.shape[0] != q.shape[0]:
        raise ValueError(f"seq_starts has {seq_starts.shape[0]} entries for {q.shape[0]} sequences")
    rt.check_same_device(q=q, seq_starts=seq_starts)
    if device.type == "cpu" and seq_starts.numel():
        starts, lens = seq_starts.long(), context_lens.long()
        if int(lens.min()) < 0 or int(starts.min()) < 0 or int((starts + lens).max()) > k_cache.shape[0]:
            raise ValueError(f"each sequence needs 0 <= seq_start and seq_start + context_len <= "
                             f"num_slots = {k_cache.shape[0]}, and context_lens >= 0")
    if rt.resolve_backend(backend, device) == "torch":
        result = contiguous_decode_attention_reference(
            q, k_cache, v_cache, seq_starts, context_lens, scale=scale,
            sliding_window=sliding_window, alibi_slopes=alibi_slopes)
        return out.copy_(result) if out is not None else result
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_splits is None and max_context_len is None:
        max_context_len = int(context_lens.max()) if context_lens.numel() else 0
    return decode_launch(q, k_cache, v_cache, seq_starts, context_lens, out, paged=False,
                         block_size=1, scale=scale, sliding_window=sliding_window,
                         alibi_slopes=alibi_slopes, num_splits=num_splits,
                         max_context=max_context_len or 0, tile_size=tile_size, num_stages=num_stages,
                         num_warps=num_warps)
