"""Compile the kernels for a GPU without a GPU: registers, spills, shared memory, load widths.

The interpreter checks what the kernels compute, not whether they compile, nor how well.
This module runs the public wrappers on small CPU tensors with every Triton launch
intercepted, turns each recorded launch into the signature the JIT would specialise
(Triton's own ``native_specialize_impl``: 16-byte aligned pointers, ints divisible by 16,
ints equal to 1 as constants), and compiles it ahead of time for a CUDA target with the
``ptxas`` bundled with Triton. For each variant it reports registers per thread, spill
(stack) bytes, shared memory, and the width of its global loads (K/V rows should move
in 16-byte ``cp.async``/``ld.global.v4`` loads; 2-byte loads there mean the alignment
analysis failed; the 4-byte ones are block-table and length loads).

    python -m pagebench.kernels.compile_check [--arch 90] [--case NAME ...]

NOTE: uses Triton internals (``ASTSource``, ``GPUTarget``, ``native_specialize_impl``); the
test that calls it skips when they are missing. It does not replace running on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import triton

from pagebench.kernels import _runtime as rt
from pagebench.kernels import bandwidth, cache_write, paged_decode
from pagebench.kernels.decode_plan import DECODE_CONFIGS, resident_ctas_per_sm

KERNEL_MODULES = (paged_decode, cache_write, bandwidth)


@dataclass(frozen=True)
class CompiledVariant:
    case: str
    kernel: str
    registers: int | None
    spill_bytes: int | None
    shared_bytes: int
    load_widths: dict[int, int]  # bytes per global load instruction -> count in the PTX
    num_warps: int
    ctas_per_sm: int | None  # resident CTAs per sm_90 SM (registers, shared memory, warps)

    def row(self) -> str:
        return (f"{self.case:<30} {self.kernel:<22} regs={self.registers} spill={self.spill_bytes}B "
                f"smem={self.shared_bytes}B warps={self.num_warps} ctas/SM={self.ctas_per_sm} "
                f"loads(bytes:count)={self.load_widths}")


class _Recorder:
    def __init__(self, name: str, kernel) -> None:
        self.name, self.kernel, self.calls = name, kernel, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, self.kernel, args, kwargs))


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """Intercept every jit kernel of the kernels modules; force the Triton path on CPU."""
    calls: list = []
    saved = []
    for module in KERNEL_MODULES:
        for name, obj in vars(module).items():
            if isinstance(obj, triton.runtime.jit.JITFunction):
                rec = _Recorder(name, obj)
                saved.append((module, name, obj, rec))
                setattr(module, name, rec)
    old_resolve = rt.resolve_backend
    rt.resolve_backend = lambda backend, device: "triton"
    try:
        yield calls
    finally:
        rt.resolve_backend = old_resolve
        for module, name, obj, rec in saved:
            setattr(module, name, obj)
            calls.extend(rec.calls)


def compile_launch(kernel, args: tuple, kwargs: dict, arch: int):
    """AOT-compile one recorded launch with the JIT's own specialisation rules."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource
    from triton.runtime.jit import native_specialize_impl

    kwargs = dict(kwargs)
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    params = list(inspect.signature(kernel.fn).parameters)
    bound = dict(zip(params, args)) | kwargs
    constexpr_params = {p.name for p in kernel.params if p.is_constexpr}
    signature, constexprs, attrs = {}, {}, {}
    for index, name in enumerate(params):
        value = bound[name]
        if name in constexpr_params:
            signature[name], constexprs[name] = "constexpr", value
            continue
        ty, key = native_specialize_impl(CUDABackend, value, False, True, True)
        signature[name] = ty
        if ty == "constexpr":
            constexprs[name] = value
        elif key:
            attrs[(index,)] = CUDABackend.parse_attr(key)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def _resource_usage(compiled) -> tuple[int | None, int | None]:
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(compiled.asm["cubin"])
        fh.flush()
        text = subprocess.run([cuobjdump, "-res-usage", fh.name], capture_output=True, text=True).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def load_widths(ptx: str) -> dict[int, int]:
    """Global loads by bytes per thread-instruction: ``ld.global`` and ``cp.async`` (pipelined)."""
    widths: Counter = Counter()
    for line in ptx.splitlines():
        cp = re.search(r"cp\.async\.c[ag]\.shared\.global\s*\[[^\]]*\],\s*\[[^\]]*\],\s*(0x[0-9a-fA-F]+|\d+)", line)
        if cp:
            widths[int(cp.group(1), 0)] += 1
            continue
        ld = re.search(r"ld\.global((?:\.\w+)*)", line)
        if ld:
            mods = ld.group(1).split(".")
            lanes = next((int(m[1:]) for m in mods if re.fullmatch(r"v\d", m)), 1)
            bits = next((int(m[1:]) for m in reversed(mods) if re.fullmatch(r"[bfsu]\d+", m)), 32)
            widths[lanes * bits // 8] += 1
    return dict(sorted(widths.items()))


def _decode_case(*, paged=True, num_seqs=4, num_heads=32, num_kv_heads=8, head_dim=128, block_size=16,
                 context=4096, dtype=torch.float16, **kw) -> Callable[[], object]:
    def run():
        q = torch.empty(num_seqs, num_heads, head_dim, dtype=dtype)
        lens = torch.full((num_seqs,), context, dtype=torch.int32)
        if paged:
            per_seq = -(-context // block_size)
            k = torch.empty(num_seqs * per_seq, block_size, num_kv_heads, head_dim, dtype=dtype)
            tables = torch.zeros(num_seqs, per_seq, dtype=torch.int32)
            return paged_decode.paged_decode_attention(q, k, k, tables, lens, **kw)
        from pagebench.kernels.contiguous_decode import contiguous_decode_attention

        k = torch.empty(num_seqs * context, num_kv_heads, head_dim, dtype=dtype)
        starts = torch.arange(num_seqs, dtype=torch.int32) * context
        return contiguous_decode_attention(q, k, k, starts, lens, **kw)
    return run


def _cache_case() -> object:
    key = torch.empty(8, 8, 128, dtype=torch.float16)
    cache = torch.empty(64, 16, 8, 128, dtype=torch.float16)
    cache_write.write_kv_cache(key, key, cache, cache, torch.arange(8))
    cache_write.copy_blocks(cache, [(0, 1)])


def _read_probe_case() -> None:
    src = torch.empty(1 << 20, dtype=torch.float16)
    out = torch.empty(16, dtype=torch.float32)
    bandwidth._read_kernel[(16,)](src, out, src.numel(), BLOCK=bandwidth.READ_BLOCK, ITERS=bandwidth.READ_ITERS,
                                  num_warps=8)


CASES: dict[str, Callable[[], object]] = {
    "mha-13b-bs16": _decode_case(num_heads=40, num_kv_heads=40),
    "gqa-8b-bs16": _decode_case(),
    "gqa-8b-bs16-split": _decode_case(num_splits=8),
    "gqa-8b-bs16-4-stages": _decode_case(num_stages=4),
    "gqa-8b-bs1": _decode_case(block_size=1),
    "gqa-8b-bs256": _decode_case(block_size=256),
    "contiguous-gqa-8b": _decode_case(paged=False, max_context_len=4096),
    "d80-bf16-window-alibi": _decode_case(head_dim=80, dtype=torch.bfloat16, sliding_window=512,
                                          alibi_slopes=torch.ones(32)),
    "d256-mqa": _decode_case(num_heads=16, num_kv_heads=1, head_dim=256),
    "fp32-gqa": _decode_case(dtype=torch.float32),
    "fp32-d256-mqa": _decode_case(num_heads=16, num_kv_heads=1, head_dim=256, dtype=torch.float32),
    "cache-write-and-copy": _cache_case,
    "read-bandwidth-probe": _read_probe_case,
    # the other configs a caller may fix (the first is the default, compiled by every case above)
    **{f"mha-13b-bs16-tile{c.tile_n}-w{c.num_warps}-s{c.num_stages}":
       _decode_case(num_heads=40, num_kv_heads=40, tile_size=c.tile_n, num_warps=c.num_warps,
                    num_stages=c.num_stages) for c in DECODE_CONFIGS[1:]},
}


def check(cases: list[str] | None = None, arch: int = 90) -> list[CompiledVariant]:
    """Compile the named cases (default: all) for ``sm_{arch}``; one result per launch."""
    results = []
    for case in cases or list(CASES):
        with recording() as calls:
            CASES[case]()
        seen = set()
        for name, kernel, args, kwargs in calls:
            compiled = compile_launch(kernel, args, kwargs, arch)
            if compiled.hash in seen:
                continue
            seen.add(compiled.hash)
            registers, spill = _resource_usage(compiled)
            warps = compiled.metadata.num_warps
            ctas = resident_ctas_per_sm(registers, compiled.metadata.shared, warps) if registers else None
            results.append(CompiledVariant(case, name, registers, spill, compiled.metadata.shared,
                                           load_widths(compiled.asm["ptx"]), warps, ctas))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagebench.kernels.compile_check", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90 = H100/H200)")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    bad = 0
    for variant in check(args.case, args.arch):
        print(variant.row(), flush=True)
        bad += bool(variant.spill_bytes)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
