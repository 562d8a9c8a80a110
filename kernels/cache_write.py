"""KV-cache writes, copy-on-write block copies and swap gathers/scatters.

Layouts (one layer; K and V alike):

* paged      [num_blocks, block_size, num_kv_heads, head_dim]: slot s = block * block_size + offset
* contiguous [num_slots, num_kv_heads, head_dim]: slot s is row s

``write_kv_cache`` stores the new tokens' K/V rows at their slots (``slot_mapping``;
negative entries are padding and skipped) in either layout: the contiguous layout is
the paged formula with block_size 1, so one kernel serves both.

Block operations (paged layout) all reduce to one kernel, "copy block ``src_ids[i]`` of
tensor A to block ``dst_ids[i]`` of tensor B", each program copying a chunk of one block:

* ``copy_blocks(cache, pairs)``: copy-on-write inside one cache (A = B).
* ``gather_blocks(cache, ids)``: blocks into a contiguous staging tensor (swap out).
* ``scatter_blocks(cache, ids, blocks)``: staging tensor into blocks (swap in).
* ``swap_blocks(src, dst, pairs)``: between a GPU cache and a CPU cache: one gather on the
  device, one host copy, then an index copy on the host (and the reverse for swap in).
  A Triton kernel cannot address host memory, so the host side is torch.

NOTE: the destination blocks of one call must be distinct and must not also be sources
(true for copy-on-write, whose destinations are freshly allocated); programs run in any
order. CPU tensors use the torch reference unless the Triton interpreter is active.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from pagebench.kernels import _runtime as rt
from pagebench.kernels import reference as ref

COPY_CHUNK = 1024  # elements per program of a block copy


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    num_kv_heads,
    stride_key_t, stride_key_h, stride_value_t, stride_value_h,
    stride_kc_b, stride_kc_t, stride_kc_h, stride_vc_b, stride_vc_t, stride_vc_h,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    valid_row = (offs_h < num_kv_heads) & ((offs_h * 0 + slot) >= 0)  # negative slot: padding, skip
    mask = valid_row[:, None] & (offs_d[None, :] < HEAD_DIM)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    k = tl.load(key_ptr + token * stride_key_t + offs_h[:, None] * stride_key_h + offs_d[None, :], mask=mask)
    v = tl.load(value_ptr + token * stride_value_t + offs_h[:, None] * stride_value_h + offs_d[None, :], mask=mask)
    k_dst = k_cache_ptr + block * stride_kc_b + offset * stride_kc_t + offs_h[:, None] * stride_kc_h + offs_d[None, :]
    v_dst = v_cache_ptr + block * stride_vc_b + offset * stride_vc_t + offs_h[:, None] * stride_vc_h + offs_d[None, :]
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _copy_blocks_kernel(
    src_ptr, dst_ptr, pairs_ptr,  # pairs: [n, 2] int64 (src block, dst block)
    stride_src_block, stride_dst_block, block_numel,
    CHUNK: tl.constexpr,
):
    pair = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_numel
    src_block = tl.load(pairs_ptr + 2 * pair).to(tl.int64)
    dst_block = tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64)
    x = tl.load(src_ptr + src_block * stride_src_block + offs, mask=mask)
    tl.store(dst_ptr + dst_block * stride_dst_block + offs, x, mask=mask)


# ---- writes -------------------------------------------------------------------------------


def write_kv_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # paged [num_blocks, block_size, H, D] or contiguous [num_slots, H, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int32/int64; negative = skip
    *,
    backend: rt.Backend = "auto",
) -> None:
    """Store token ``i``'s key/value rows at slot ``slot_mapping[i]`` of the caches (in place)."""
    if k_cache.dim() not in (3, 4) or v_cache.shape != k_cache.shape:
        raise ValueError("k_cache/v_cache must both be [num_blocks, block_size, H, D] or [num_slots, H, D], "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    num_kv_heads, head_dim = k_cache.shape[-2:]
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3 or tuple(t.shape[1:]) != (num_kv_heads, head_dim):
            raise ValueError(f"{name} must be [num_tokens, {num_kv_heads}, {head_dim}], got {tuple(t.shape)}")
        rt.check_float_dtype(name, t)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        rt.check_float_dtype(name, t)
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride(-1) == 1)")
    if value.shape[0] != key.shape[0]:
        raise ValueError(f"key has {key.shape[0]} tokens but value has {value.shape[0]}")
    rt.check_index_tensor("slot_mapping", slot_mapping, 1)
    if slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens")
    device = rt.check_same_device(key=key, value=value, k_cache=k_cache, v_cache=v_cache,
                                  slot_mapping=slot_mapping)
    paged = k_cache.dim() == 4
    block_size = k_cache.shape[1] if paged else 1
    num_slots = k_cache.shape[0] * block_size
    if device.type == "cpu" and slot_mapping.numel() and int(slot_mapping.max()) >= num_slots:
        raise ValueError(f"slot_mapping refers to slot {int(slot_mapping.max())} of a cache with {num_slots} slots")
    if rt.resolve_backend(backend, device) == "torch":
        ref.write_kv_cache_reference(key, value, k_cache, v_cache, slot_mapping)
        return
    if key.shape[0] == 0:
        return
    key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (key, value))
    head_dim_pad = rt.next_pow2(head_dim)
    heads_per_program = max(1, min(rt.next_pow2(num_kv_heads), 4096 // head_dim_pad))
    if paged:
        kc_strides, vc_strides = k_cache.stride()[:3], v_cache.stride()[:3]
    else:
        kc_strides = (k_cache.stride(0), 0, k_cache.stride(1))
        vc_strides = (v_cache.stride(0), 0, v_cache.stride(1))
    grid = (key.shape[0], triton.cdiv(num_kv_heads, heads_per_program))
    _write_kv_kernel[grid](
        key, value, k_cache, v_cache, slot_mapping, num_kv_heads,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *kc_strides, *vc_strides,
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        HEADS_PER_PROGRAM=heads_per_program, num_warps=4,
    )


# ---- block copies, gathers and scatters ------------------------------------------------------


def _pairs_tensor(pairs: Sequence[tuple[int, int]] | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(pairs, torch.Tensor):
        t = pairs.to(device=device, dtype=torch.int64)
    else:
        t = torch.tensor([tuple(p) for p in pairs], dtype=torch.int64).reshape(-1, 2).to(device)
    if t.dim() != 2 or t.shape[1] != 2:
        raise ValueError(f"block pairs must be (src, dst) pairs, shape [n, 2]; got {tuple(t.shape)}")
    return t.contiguous()


def _check_block_tensor(name: str, cache: torch.Tensor) -> int:
    """Elements per block; each block (everything after dim 0) must be contiguous."""
    if not isinstance(cache, torch.Tensor) or cache.dim() < 2:
        raise ValueError(f"{name} must be a tensor of blocks [num_blocks, ...]")
    if not cache[0].is_contiguous():
        raise ValueError(f"each block of {name} (all dims after the first) must be contiguous")
    return cache[0].numel()


def _check_pairs(pairs: torch.Tensor, num_src: int, num_dst: int) -> None:
    """Range, distinct destinations, destinations not sources (host-side; CPU pairs only)."""
    if pairs.numel() == 0:
        return
    src, dst = pairs[:, 0], pairs[:, 1]
    if int(src.min()) < 0 or int(src.max()) >= num_src or int(dst.min()) < 0 or int(dst.max()) >= num_dst:
        raise ValueError(f"block ids out of range: sources must be in 0..{num_src - 1}, "
                         f"destinations in 0..{num_dst - 1}")
    if dst.unique().numel() != dst.numel():
        raise ValueError("destination blocks must be distinct")


def _launch_copy(src: torch.Tensor, dst: torch.Tensor, pairs: torch.Tensor, block_numel: int) -> None:
    if pairs.shape[0] == 0:
        return
    grid = (pairs.shape[0], triton.cdiv(block_numel, COPY_CHUNK))
    _copy_blocks_kernel[grid](src, dst, pairs, src.stride(0), dst.stride(0), block_numel,
                              CHUNK=COPY_CHUNK, num_warps=4)


def copy_blocks(
    cache: torch.Tensor | Sequence[torch.Tensor],  # one or several [num_blocks, ...] caches (layers, K and V)
    pairs: Sequence[tuple[int, int]] | torch.Tensor,  # (src, dst) block pairs
    *,
    backend: rt.Backend = "auto",
) -> None:
    """Copy-on-write: ``cache[dst] = cache[src]`` for every pair, in every given cache."""
    caches = [cache] if isinstance(cache, torch.Tensor) else list(cache)
    if not caches:
        return
    host_pairs = _pairs_tensor(pairs, torch.device("cpu"))
    for c in caches:
        _check_block_tensor("cache", c)
        if c.shape[0] != caches[0].shape[0]:
            raise ValueError("all caches given to copy_blocks must have the same number of blocks")
    _check_pairs(host_pairs, caches[0].shape[0], caches[0].shape[0])
    if host_pairs.numel() and bool(torch.isin(host_pairs[:, 1], host_pairs[:, 0]).any()):
        raise ValueError("a destination block is also a source; split the copy into two calls")
    device_pairs: dict[torch.device, torch.Tensor] = {}
    for c in caches:
        if rt.resolve_backend(backend, c.device) == "torch":
            ref.copy_blocks_reference(c, host_pairs)
            continue
        if c.device not in device_pairs:
            device_pairs[c.device] = host_pairs.to(c.device)
        _launch_copy(c, c, device_pairs[c.device], c[0].numel())


def gather_blocks(
    cache: torch.Tensor,  # [num_blocks, *block_shape]
    block_ids: torch.Tensor | Sequence[int],  # [n]
    *,
    backend: rt.Backend = "auto",
) -> torch.Tensor:  # [n, *block_shape], contiguous, on cache.device
    """The blocks ``cache[block_ids]`` packed into one contiguous tensor (swap-out staging)."""
    block_numel = _check_block_tensor("cache", cache)
    ids = torch.as_tensor(block_ids, dtype=torch.int64).reshape(-1)
    _check_pairs(torch.stack([ids.cpu(), torch.arange(ids.numel())], 1), cache.shape[0], ids.numel())
    if rt.resolve_backend(backend, cache.device) == "torch":
        return ref.gather_blocks_reference(cache, ids)
    out = torch.empty((ids.numel(), *cache.shape[1:]), dtype=cache.dtype, device=cache.device)
    pairs = torch.stack([ids, torch.arange(ids.numel())], 1).to(cache.device)
    _launch_copy(cache, out, pairs, block_numel)
    return out


def scatter_blocks(
    cache: torch.Tensor,  # [num_blocks, *block_shape]
    block_ids: torch.Tensor | Sequence[int],  # [n]
    blocks: torch.Tensor,  # [n, *block_shape], any device
    *,
    backend: rt.Backend = "auto",
) -> None:
    """``cache[block_ids[i]] = blocks[i]`` (swap-in); ``blocks`` is moved to the cache's device once."""
    block_numel = _check_block_tensor("cache", cache)
    ids = torch.as_tensor(block_ids, dtype=torch.int64).reshape(-1)
    if tuple(blocks.shape) != (ids.numel(), *cache.shape[1:]):
        raise ValueError(f"blocks must be [{ids.numel()}, {', '.join(map(str, cache.shape[1:]))}], "
                         f"got {tuple(blocks.shape)}")
    if blocks.dtype != cache.dtype:
        raise ValueError(f"blocks dtype {blocks.dtype} != cache dtype {cache.dtype}")
    _check_pairs(torch.stack([torch.arange(ids.numel()), ids.cpu()], 1), ids.numel(), cache.shape[0])
    if rt.resolve_backend(backend, cache.device) == "torch":
        ref.scatter_blocks_reference(cache, ids, blocks)
        return
    staged = blocks.to(cache.device, non_blocking=True).contiguous()
    pairs = torch.stack([torch.arange(ids.numel()), ids], 1).to(cache.device)
    _launch_copy(staged, cache, pairs, block_numel)


def swap_blocks(
    src_cache: torch.Tensor,  # [num_src_blocks, *block_shape]
    dst_cache: torch.Tensor,  # [num_dst_blocks, *block_shape], possibly on another device
    pairs: Sequence[tuple[int, int]] | torch.Tensor,  # (src block, dst block)
    *,
    backend: rt.Backend = "auto",
) -> None:
    """Swap out (GPU -> CPU) or in (CPU -> GPU): ``dst_cache[dst] = src_cache[src]``."""
    if tuple(src_cache.shape[1:]) != tuple(dst_cache.shape[1:]) or src_cache.dtype != dst_cache.dtype:
        raise ValueError("src_cache and dst_cache must have the same block shape and dtype, got "
                         f"{tuple(src_cache.shape)} {src_cache.dtype} and {tuple(dst_cache.shape)} {dst_cache.dtype}")
    host_pairs = _pairs_tensor(pairs, torch.device("cpu"))
    _check_pairs(host_pairs, src_cache.shape[0], dst_cache.shape[0])
    if host_pairs.numel() == 0:
        return
    if src_cache.device == dst_cache.device:
        if src_cache.data_ptr() == dst_cache.data_ptr():
            copy_blocks(src_cache, host_pairs, backend=backend)
        elif rt.resolve_backend(backend, src_cache.device) == "torch":
            dst_cache[host_pairs[:, 1]] = src_cache[host_pairs[:, 0]]
        else:
            block_numel = _check_block_tensor("src_cache", src_cache)
            _check_block_tensor("dst_cache", dst_cache)
            _launch_copy(src_cache, dst_cache, host_pairs.to(src_cache.device), block_numel)
        return
    # Across devices the host side is plain torch indexing (whatever ``backend`` says); the
    # device side is one gather or scatter kernel and the transfer is one contiguous copy.
    if src_cache.device.type == "cpu":
        staged = src_cache[host_pairs[:, 0]]
        scatter_blocks(dst_cache, host_pairs[:, 1], staged, backend=backend)
    elif dst_cache.device.type == "cpu":
        staged = gather_blocks(src_cache, host_pairs[:, 0], backend=backend)
        dst_cache[host_pairs[:, 1]] = staged.to("cpu")
    else:  # two accelerators
        staged = gather_blocks(src_cache, host_pairs[:, 0], backend=backend)
        scatter_blocks(dst_cache, host_pairs[:, 1], staged, backend=backend)
