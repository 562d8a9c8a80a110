"""Paged and contiguous prefill attention against a float64 reference.

Without CUDA the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set below before
triton is imported); with CUDA the same tests run the compiled kernel. Every slot the
kernel must not read -- spare blocks, table entries past a sequence's end, gaps between
contiguous sequences, tokens before the first query's sliding window -- holds NaN, and the
output is NaN before the call, so a stray read or a missed write cannot pass. The float64
reference is checked against plain causal attention over the whole sequence first.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from pagebench.kernels import _runtime as rt  # noqa: E402
from pagebench.kernels.paged_prefill import prefill_attention, prefill_attention_reference  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
TRITON_IN_PROCESS = CUDA or rt.interpreter_active()
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _case(seed, chunks, *, num_heads, num_kv_heads, head_dim, block_size, dtype, window=None):
    """chunks: (context_len, query rows) per sequence. Returns q, both layouts, the index
    tensors and each sequence's full K/V (for the dense check)."""
    gen = torch.Generator().manual_seed(seed)
    lens = [length for length, _ in chunks]
    blocks_per_seq = [-(-n // block_size) for n in lens]
    num_blocks = sum(blocks_per_seq) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_paged, v_paged = torch.full(shape, float("nan"), dtype=dtype), torch.full(shape, float("nan"), dtype=dtype)
    tables = torch.full((len(lens), max(blocks_per_seq) + 1), int(perm[-1]), dtype=torch.int32)
    starts, cursor = [], 1
    for n in lens:
        starts.append(cursor)
        cursor += n + 2  # NaN gaps between contiguous sequences
    k_contig = torch.full((cursor, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_contig = torch.full_like(k_contig, float("nan"))
    full, used = [], 0
    for seq, (n, rows) in enumerate(chunks):
        blocks = perm[used:used + blocks_per_seq[seq]]
        used += blocks_per_seq[seq]
        tables[seq, :len(blocks)] = blocks.to(torch.int32)
        keys = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        values = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        full.append((keys.clone(), values.clone()))
        if window is not None:  # before the first query's window: never read
            keys[:max(0, n - rows - window + 1)] = float("nan")
            values[:max(0, n - rows - window + 1)] = float("nan")
        pos = torch.arange(n)
        k_paged[blocks[pos // block_size], pos % block_size] = keys
        v_paged[blocks[pos // block_size], pos % block_size] = values
        k_contig[starts[seq]:starts[seq] + n], v_contig[starts[seq]:starts[seq] + n] = keys, values
    rows = [r for _, r in chunks]
    query_starts = torch.tensor([0] + torch.tensor(rows).cumsum(0).tolist(), dtype=torch.int32)
    q = (1.5 * torch.randn(sum(rows), num_heads, head_dim, generator=gen)).to(dtype)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return dict(q=to(q), paged=(to(k_paged), to(v_paged), to(tables)),
                contiguous=(to(k_contig), to(v_contig), to(torch.tensor(starts, dtype=torch.int32))),
                query_starts=to(query_starts), context_lens=to(torch.tensor(lens, dtype=torch.int32)),
                full=full, max_rows=max(rows))


def test_reference_is_causal_attention_over_the_whole_sequence():
    """float64 reference == softmax(q k^T) v over each sequence's keys, masked causally."""
    case = _case(1, [(37, 5), (16, 16), (9, 1)], num_heads=4, num_kv_heads=2, head_dim=16,
                 block_size=4, dtype=torch.float64, window=None)
    k, v, tables = case["paged"]
    got = prefill_attention_reference(case["q"], k, v, tables, case["query_starts"], case["context_lens"],
                                      scale=0.25, compute_dtype=torch.float64)
    starts = case["query_starts"].tolist()
    for c, (keys, values) in enumerate(case["full"]):
        n, length = starts[c + 1] - starts[c], keys.shape[0]
        q = case["q"][starts[c]:starts[c + 1]].cpu()
        kk, vv = keys.repeat_interleave(2, dim=1), values.repeat_interleave(2, dim=1)  # [L, heads, d]
        scores = torch.einsum("thd,mhd->htm", q, kk) * 0.25
        mask = torch.arange(length)[None, :] > torch.arange(length - n, length)[:, None]
        expected = torch.einsum("htm,mhd->thd", scores.masked_fill(mask, float("-inf")).softmax(-1), vv)
        torch.testing.assert_close(got[starts[c]:starts[c + 1]].cpu(), expected)


@pytest.mark.skipif(TRITON_IN_PROCESS, reason="the kernel runs in this process")
def test_kernel_suite_in_subprocess():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                          env=env, capture_output=True, text=True, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


CASES = [  # (chunks, heads, kv heads, head_dim, block size, dtype, window)
    ([(37, 5), (16, 16), (9, 1), (70, 20)], 4, 2, 16, 16, torch.float32, None),  # GQA, prefix hits
    ([(33, 33), (18, 3)], 2, 2, 24, 1, torch.float32, None),  # head_dim not a power of two
    ([(50, 19), (40, 40)], 4, 1, 32, 8, torch.float16, 7),  # sliding window, MQA
    ([(65, 17)], 2, 2, 16, 4, torch.bfloat16, None),  # two query tiles
]


@pytest.mark.skipif(not TRITON_IN_PROCESS, reason="run by test_kernel_suite_in_subprocess")
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("case_args", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_kernel_matches_float64_reference(case_args, layout):
    chunks, heads, kv_heads, head_dim, block_size, dtype, window = case_args
    case = _case(7, chunks, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                 block_size=block_size, dtype=dtype, window=window)
    k, v, index = case[layout]
    out = torch.full_like(case["q"], float("nan"))
    prefill_attention(case["q"], k, v, index, case["query_starts"], case["context_lens"],
                      max_query_len=case["max_rows"], sliding_window=window, out=out, backend="triton")
    expected = prefill_attention_reference(case["q"], k, v, index, case["query_starts"],
                                           case["context_lens"], scale=head_dim ** -0.5,
                                           sliding_window=window, compute_dtype=torch.float64)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected.double(), rtol=TOL[dtype], atol=TOL[dtype])
