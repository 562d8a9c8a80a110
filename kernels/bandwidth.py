"""The device's memory-bandwidth ceilings, measured in the same run as the kernels.

* copy: ``dst.copy_(src)``; (bytes read + bytes written) / time.
* read: every byte of a buffer read once and reduced to one float per program (a Triton
  kernel on CUDA, ``torch.sum`` on CPU); bytes read / time. Decode attention only reads
  the cache (its writes are one row per head), so the read ceiling is the one to compare
  it with; the copy ceiling is kept beside it (HBM turnarounds make copies slower).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

READ_BLOCK = 4096  # elements per program and iteration (8 warps x 32 lanes x 16 elements)
READ_ITERS = 16


@triton.jit
def _read_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def _fp16_buffer(device: torch.device, nbytes: int) -> torch.Tensor:
    return torch.empty(max(nbytes // 2, 1), dtype=torch.float16, device=device).normal_()


def copy_bandwidth(timer: Callable[[Callable[[], object]], float], device: torch.device, nbytes: int) -> float:
    """GB/s of ``dst.copy_(src)`` over ``nbytes``, counting bytes read + bytes written."""
    src = _fp16_buffer(device, nbytes)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def read_bandwidth(timer: Callable[[Callable[[], object]], float], device: torch.device, nbytes: int) -> float:
    """GB/s of reading ``nbytes`` once (bytes read / time)."""
    src = _fp16_buffer(device, nbytes)
    if device.type == "cuda":
        per_program = READ_BLOCK * READ_ITERS
        programs = triton.cdiv(src.numel(), per_program)
        out = torch.empty(programs, dtype=torch.float32, device=device)

        def run():
            _read_kernel[(programs,)](src, out, src.numel(), BLOCK=READ_BLOCK, ITERS=READ_ITERS, num_warps=8)
    else:  # CPUs add fp16 slowly: the same bytes summed as fp32
        words = src[: src.numel() // 2 * 2].view(torch.float32)

        def run():
            torch.sum(words)
    ms = timer(run)
    return src.numel() * src.element_size() / (ms * 1e-3) / 1e9
