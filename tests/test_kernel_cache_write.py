"""Cache writes, copy-on-write block copies and swap gathers/scatters against torch.

Without CUDA the Triton kernels run in the interpreter (TRITON_INTERPRET=1 is set below
before triton is imported). Caches start as NaN so that a write to a wrong slot, or a
missed one, shows; results are compared bit for bit (these kernels only move data).
"""

from __future__ import annotations

import os
import zlib

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from conftest import rerun_in_triton_interpreter  # noqa: E402

from pagebench.kernels import _runtime as rt  # noqa: E402
from pagebench.kernels import reference as ref  # noqa: E402
from pagebench.kernels.cache_write import copy_blocks, gather_blocks, scatter_blocks, swap_blocks, write_kv_cache  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
TRITON_IN_PROCESS = CUDA or rt.interpreter_active()


_needs_triton, test_cache_suite_in_subprocess = rerun_in_triton_interpreter(__file__, TRITON_IN_PROCESS)


@pytest.fixture
def gen(request) -> torch.Generator:
    """Fresh, reproducible random inputs per test."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


def nan_cache(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality in which NaN == NaN (slots never written stay NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_int = _INT_OF_SIZE[a.element_size()]
    return torch.equal(a.contiguous().view(as_int), b.to(a.device).contiguous().view(as_int))


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("dtype,head_dim", [(torch.float16, 128), (torch.bfloat16, 80), (torch.float32, 64)])
def test_write_kv_cache_stores_rows_at_slots(gen, layout, dtype, head_dim):
    num_kv_heads, block_size, num_blocks = 3, 8, 6
    shape = ((num_blocks, block_size, num_kv_heads, head_dim) if layout == "paged"
             else (num_blocks * block_size, num_kv_heads, head_dim))
    num_tokens = 13
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1  # padding tokens are skipped
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    k_cache, v_cache = nan_cache(shape, dtype), nan_cache(shape, dtype)
    k_expect, v_expect = k_cache.clone(), v_cache.clone()
    write_kv_cache(key, value, k_cache, v_cache, slots.to(DEVICE))
    ref.write_kv_cache_reference(key, value, k_expect, v_expect, slots.to(DEVICE))
    assert same(k_cache, k_expect) and same(v_cache, v_expect)
    flat = k_cache.reshape(-1, num_kv_heads, head_dim)
    assert torch.isnan(flat[slots[slots >= 0].to(DEVICE)]).sum() == 0
    assert torch.isnan(flat).any(dim=(1, 2)).sum() == num_blocks * block_size - (num_tokens - 2)


def test_write_kv_cache_from_strided_views_and_converting_dtype(gen):
    """key/value sliced out of a fused qkv projection; fp32 rows stored into an fp16 cache."""
    qkv = torch.randn(5, 12, 64, generator=gen).to(DEVICE)
    key, value = qkv[:, 4:8], qkv[:, 8:12]
    slots = torch.tensor([3, 0, 17, 9, 30], device=DEVICE)
    k_cache, v_cache = nan_cache((4, 8, 4, 64), torch.float16), nan_cache((4, 8, 4, 64), torch.float16)
    k_expect, v_expect = k_cache.clone(), v_cache.clone()
    write_kv_cache(key, value, k_cache, v_cache, slots)
    ref.write_kv_cache_reference(key, value, k_expect, v_expect, slots)
    assert same(k_cache, k_expect) and same(v_cache, v_expect)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_copy_blocks_copies_on_write_in_every_cache(gen, dtype):
    shape = (10, 16, 2, 64)
    caches = [torch.randn(shape, generator=gen).to(dtype).to(DEVICE) for _ in range(4)]  # 2 layers x K, V
    expected = [c.clone() for c in caches]
    pairs = [(0, 7), (3, 2), (3, 9), (5, 1)]
    copy_blocks(caches, pairs)
    for c in expected:
        ref.copy_blocks_reference(c, pairs)
    assert all(same(c, e) for c, e in zip(caches, expected))
    assert same(caches[0][9], caches[0][3]) and same(caches[0][2], caches[0][3])


def test_copy_blocks_rejects_unsafe_pairs():
    cache = torch.zeros(6, 4, 1, 64, device=DEVICE)
    with pytest.raises(ValueError, match="distinct"):
        copy_blocks(cache, [(0, 3), (1, 3)])
    with pytest.raises(ValueError, match="also a source"):
        copy_blocks(cache, [(0, 3), (3, 4)])
    with pytest.raises(ValueError, match="out of range"):
        copy_blocks(cache, [(0, 6)])
    with pytest.raises(ValueError, match=r"shape \[n, 2\]"):
        copy_blocks(cache, torch.tensor([1, 2, 3]))


def test_gather_then_scatter_round_trips(gen):
    cache = torch.randn(12, 8, 2, 96, generator=gen).half().to(DEVICE)
    ids = torch.tensor([11, 0, 5, 6])
    staged = gather_blocks(cache, ids)
    assert staged.is_contiguous() and same(staged, cache[ids.to(DEVICE)])
    target = nan_cache(cache.shape, cache.dtype)
    scatter_blocks(target, [2, 3, 9, 1], staged.cpu())  # blocks may come from the host
    assert same(target[torch.tensor([2, 3, 9, 1], device=DEVICE)], staged)
    assert torch.isnan(target[[0, 4, 5, 6, 7, 8, 10, 11]]).all()


def test_swap_out_and_in_through_a_host_cache(gen):
    gpu_cache = torch.randn(8, 16, 2, 64, generator=gen).to(torch.bfloat16).to(DEVICE)
    host_cache = torch.full((5, 16, 2, 64), float("nan"), dtype=torch.bfloat16)
    swap_blocks(gpu_cache, host_cache, [(6, 0), (1, 4)])  # swap out
    assert same(host_cache[0], gpu_cache[6].cpu()) and same(host_cache[4], gpu_cache[1].cpu())
    assert torch.isnan(host_cache[1:4]).all()
    restored = nan_cache(gpu_cache.shape, gpu_cache.dtype)
    swap_blocks(host_cache, restored, [(0, 2), (4, 7)])  # swap in, to other blocks
    assert same(restored[2], gpu_cache[6]) and same(restored[7], gpu_cache[1])
    assert torch.isnan(restored[[0, 1, 3, 4, 5, 6]]).all()


def test_swap_rejects_mismatched_caches():
    with pytest.raises(ValueError, match="same block shape"):
        swap_blocks(torch.zeros(4, 16, 2, 64), torch.zeros(4, 8, 2, 64), [(0, 0)])


@pytest.mark.parametrize("mutate,match", [
    (lambda a: a.update(slot_mapping=torch.tensor([0, 99])), "slot 99"),
    (lambda a: a.update(slot_mapping=torch.tensor([0.0, 1.0])), "int32 or int64"),
    (lambda a: a.update(slot_mapping=torch.tensor([0])), "1 entries for 2 tokens"),
    (lambda a: a.update(key=torch.zeros(2, 3, 64)), r"key must be \[num_tokens, 2, 64\]"),
    (lambda a: a.update(v_cache=torch.zeros(4, 8, 2, 32)), "k_cache/v_cache"),
    (lambda a: a.update(key=torch.zeros(2, 2, 64, dtype=torch.int32)), "supported"),
])
def test_write_kv_cache_rejects_bad_inputs(mutate, match):
    args = {"key": torch.zeros(2, 2, 64), "value": torch.zeros(2, 2, 64), "k_cache": torch.zeros(4, 8, 2, 64),
            "v_cache": torch.zeros(4, 8, 2, 64), "slot_mapping": torch.tensor([0, 1])}
    mutate(args)
    with pytest.raises(ValueError, match=match):
        write_kv_cache(**args)
