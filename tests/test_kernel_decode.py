"""Paged and contiguous decode attention against a float64 reference.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set below before
triton is imported); with CUDA the same tests run the compiled kernels. Every slot a
kernel must not read -- unused blocks, the tail of a last block, tokens before a sliding
window, gaps between contiguous sequences, table entries past a sequence's end -- holds
NaN, and every output buffer is NaN before the call, so a stray read or a missed write
cannot pass.
"""

from __future__ import annotations

import heapq
import os
import subprocess
import sys
import zlib
from dataclasses import dataclass

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from conftest import rerun_in_triton_interpreter  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pagebench.kernels import _runtime as rt  # noqa: E402
from pagebench.kernels.contiguous_decode import contiguous_decode_attention  # noqa: E402
from pagebench.kernels.decode_plan import (DECODE_CONFIGS, FALLBACK_CONFIG, choose_num_splits, launch_plan,  # noqa: E402
                                           resident_ctas_per_sm, select_config)
from pagebench.kernels.paged_decode import last_kernel_config, paged_decode_attention  # noqa: E402
from pagebench.kernels.reference import (  # noqa: E402
    contiguous_decode_attention_reference,
    paged_decode_attention_reference,
)

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
TRITON_IN_PROCESS = CUDA or rt.interpreter_active()
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


_needs_triton, test_kernel_suite_in_subprocess = rerun_in_triton_interpreter(__file__, TRITON_IN_PROCESS)


def seed_of(request) -> int:
    """A fresh, reproducible seed per test (from its node id)."""
    return zlib.crc32(request.node.nodeid.encode())


def ragged_lens(block_size: int, long: int) -> list[int]:
    """1, bs - 1, bs, bs + 1 and a long context (duplicates and 0 dropped)."""
    return sorted({n for n in (1, block_size - 1, block_size, block_size + 1, long) if n > 0})


@dataclass
class DecodeCase:
    q: torch.Tensor
    k_paged: torch.Tensor
    v_paged: torch.Tensor
    block_tables: torch.Tensor
    k_contig: torch.Tensor
    v_contig: torch.Tensor
    seq_starts: torch.Tensor
    context_lens: torch.Tensor
    alibi_slopes: torch.Tensor | None
    sliding_window: int | None

    def kwargs(self) -> dict:
        return {"sliding_window": self.sliding_window, "alibi_slopes": self.alibi_slopes}

    def reference(self, paged: bool = True, **kw) -> torch.Tensor:
        args = ((self.q, self.k_paged, self.v_paged, self.block_tables) if paged
                else (self.q, self.k_contig, self.v_contig, self.seq_starts))
        fn = paged_decode_attention_reference if paged else contiguous_decode_attention_reference
        return fn(*args, self.context_lens, compute_dtype=torch.float64, out_dtype=torch.float64,
                  **self.kwargs(), **kw)

    def poisoned_out(self) -> torch.Tensor:
        return torch.full_like(self.q, float("nan"))


def make_case(seed: int, lens: list[int], *, num_heads: int, num_kv_heads: int, head_dim: int,
              block_size: int, dtype: torch.dtype, sliding_window: int | None = None,
              alibi: bool = False) -> DecodeCase:
    """Random K/V laid out both paged (scattered blocks) and contiguous (shuffled, gaps)."""
    gen = torch.Generator().manual_seed(seed)
    num_seqs = len(lens)
    blocks_per_seq = [-(-n // block_size) for n in lens]
    max_blocks = max(blocks_per_seq + [0]) + 1  # one spare column: tables are wider than needed
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks stay NaN; the last one poisons table tails
    perm = torch.randperm(num_blocks, generator=gen)
    poison_block = int(perm[-1])
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_paged = torch.full(shape, float("nan"), dtype=dtype)
    v_paged = torch.full(shape, float("nan"), dtype=dtype)
    tables = torch.full((num_seqs, max_blocks), poison_block, dtype=torch.int32)

    order = torch.randperm(num_seqs, generator=gen).tolist()
    gaps = torch.randint(0, 4, (num_seqs,), generator=gen).tolist()
    starts = [0] * num_seqs
    cursor = 1
    for seq in order:  # contiguous placement in shuffled order with NaN gaps between
        starts[seq] = cursor
        cursor += lens[seq] + gaps[seq]
    k_contig = torch.full((cursor + 1, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_contig = torch.full_like(k_contig, float("nan"))

    used = 0
    for seq, n in enumerate(lens):
        blocks = perm[used:used + blocks_per_seq[seq]]
        used += blocks_per_seq[seq]
        tables[seq, :len(blocks)] = blocks.to(torch.int32)
        keys = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        values = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        if sliding_window is not None:  # tokens before the window must never be read
            keys[: max(0, n - sliding_window)] = float("nan")
            values[: max(0, n - sliding_window)] = float("nan")
        pos = torch.arange(n)
        k_paged[blocks[pos // block_size], pos % block_size] = keys
        v_paged[blocks[pos // block_size], pos % block_size] = values
        k_contig[starts[seq]:starts[seq] + n] = keys
        v_contig[starts[seq]:starts[seq] + n] = values

    q = (1.5 * torch.randn(num_seqs, num_heads, head_dim, generator=gen)).to(dtype)
    slopes = torch.rand(num_heads, generator=gen) * 0.5 + 0.01 if alibi else None
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return DecodeCase(to(q), to(k_paged), to(v_paged), to(tables), to(k_contig), to(v_contig),
                      to(torch.tensor(starts, dtype=torch.int32)), to(torch.tensor(lens, dtype=torch.int32)),
                      to(slopes), sliding_window)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, seed: int) -> None:
    assert not torch.isnan(out).any(), f"NaN in output (seed {seed})"
    tol = TOL[dtype]
    torch.testing.assert_close(out.double(), ref.to(out.device), atol=tol, rtol=tol,
                               msg=lambda m: f"seed {seed}: {m}")


# block_size x head_dim x dtype x GQA ratio x split-K, two interleaved rounds so that every
# block size, head dim, dtype and ratio appears with split-K both on and off.
BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
HEAD_DIMS = [64, 80, 96, 128, 256]
DTYPES = [F16, BF16, F32]
GROUPS = [(1, 2), (4, 2), (8, 1)]  # (query heads per KV head, KV heads)
CASES = [
    (bs, HEAD_DIMS[(i + r) % 5], DTYPES[(i + 2 * r) % 3], GROUPS[(i + r) % 3], 1 + 2 * ((i + r) % 2))
    for r in range(2) for i, bs in enumerate(BLOCK_SIZES)
]


@pytest.mark.parametrize("block_size,head_dim,dtype,group,num_splits", CASES,
                         ids=[f"bs{c[0]}-d{c[1]}-{str(c[2])[6:]}-g{c[3][0]}-s{c[4]}" for c in CASES])
def test_paged_decode_matches_float64_reference(request, block_size, head_dim, dtype, group, num_splits):
    seed = seed_of(request)
    ratio, kv_heads = group
    lens = ragged_lens(block_size, long=max(block_size + 70, 150))
    case = make_case(seed, lens, num_heads=ratio * kv_heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     block_size=block_size, dtype=dtype)
    out = case.poisoned_out()
    result = paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                                    num_splits=num_splits, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert_matches(out, case.reference(), dtype, seed)


@pytest.mark.parametrize("sliding_window,alibi,num_splits", [
    (1, False, 1), (5, True, 4), (40, False, 4), (40, True, 1), (10_000, True, 4), (10_000, False, 1),
])
def test_sliding_window_and_alibi(request, sliding_window, alibi, num_splits):
    seed = seed_of(request)
    case = make_case(seed, ragged_lens(8, long=150), num_heads=8, num_kv_heads=2, head_dim=64,
                     block_size=8, dtype=F32, sliding_window=sliding_window, alibi=alibi)
    out = case.poisoned_out()
    paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                           num_splits=num_splits, out=out, **case.kwargs())
    assert_matches(out, case.reference(), F32, seed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_alibi_with_window_in_half_precision(request, dtype):
    seed = seed_of(request)
    case = make_case(seed, ragged_lens(16, long=200), num_heads=8, num_kv_heads=1, head_dim=128,
                     block_size=16, dtype=dtype, sliding_window=70, alibi=True)
    out = case.poisoned_out()
    paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                           num_splits=2, out=out, **case.kwargs())
    assert_matches(out, case.reference(), dtype, seed)


@pytest.mark.parametrize("num_splits", [2, 3, 7, 16])
def test_split_k_agrees_with_no_split(request, num_splits):
    """More splits than tiles leaves some splits empty; the reduction must ignore them."""
    seed = seed_of(request)
    case = make_case(seed, [1, 33, 300], num_heads=4, num_kv_heads=1, head_dim=64, block_size=16, dtype=F32)
    whole = paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                                   num_splits=1, out=case.poisoned_out())
    split = paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                                   num_splits=num_splits, out=case.poisoned_out())
    assert_matches(split, case.reference(), F32, seed)
    torch.testing.assert_close(split, whole, atol=1e-5, rtol=1e-5)


H200_PLAN_CASES = [  # (batch, (query heads, KV heads), block size): MHA, GQA 4 and 8, MQA; odd and even batches
    (1, (4, 4), 16), (1, (16, 2), 1), (1, (8, 1), 256), (3, (8, 2), 8), (3, (8, 1), 32),
    (8, (16, 2), 2), (8, (4, 4), 64), (64, (8, 2), 16), (64, (8, 1), 128),
]


@pytest.mark.parametrize("batch,heads,block_size", H200_PLAN_CASES,
                         ids=[f"b{b}-h{h[0]}-kv{h[1]}-bs{bs}" for b, h, bs in H200_PLAN_CASES])
def test_h200_launch_plans_match_float64_reference(request, batch, heads, block_size):
    """The split the heuristic picks on an H200 (132 SMs), at batch 1..64, for MHA, GQA groups
    4 and 8 and MQA, ragged contexts (a partial last block and tile), paged and contiguous."""
    seed = seed_of(request)
    num_heads, kv_heads = heads
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 200 if batch < 64 else 80, (batch,), generator=gen).tolist()
    case = make_case(seed, lens, num_heads=num_heads, num_kv_heads=kv_heads, head_dim=32,
                     block_size=block_size, dtype=F16)
    bound = block_size * case.block_tables.shape[1]
    splits = launch_plan(batch, num_heads, kv_heads, 32, max_context=bound, sms=132).num_splits
    out = paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                                 num_splits=splits, out=case.poisoned_out())
    assert_matches(out, case.reference(), F16, seed)
    contig = contiguous_decode_attention(case.q, case.k_contig, case.v_contig, case.seq_starts, case.context_lens,
                                         num_splits=splits, out=case.poisoned_out())
    assert torch.equal(out, contig)


def test_query_group_larger_than_a_program_is_chunked(request):
    """MQA with 72 query heads: more rows than one program holds (64), so two chunks per KV head."""
    seed = seed_of(request)
    case = make_case(seed, [1, 40], num_heads=72, num_kv_heads=1, head_dim=80, block_size=32, dtype=F16)
    out = case.poisoned_out()
    paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                           num_splits=2, out=out)
    assert_matches(out, case.reference(), F16, seed)


@pytest.mark.parametrize("tile_size", [16, 32, 128])
def test_tile_size_override(request, tile_size):
    seed = seed_of(request)
    case = make_case(seed, ragged_lens(4, long=140), num_heads=4, num_kv_heads=2, head_dim=96,
                     block_size=4, dtype=F16)
    out = case.poisoned_out()
    paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                           tile_size=tile_size, out=out)
    assert_matches(out, case.reference(), F16, seed)


@pytest.mark.parametrize("block_size", [1, 16, 128])
@pytest.mark.parametrize("config", DECODE_CONFIGS, ids=lambda c: f"tile{c.tile_n}-w{c.num_warps}-s{c.num_stages}")
def test_every_fixable_config_matches_reference(request, config, block_size):
    """Each config a caller may fix: full unmasked tiles, the peeled partial tile, block ids
    loaded per block (vector of ids, one id per tile, or a slice of one block), 3 splits, GQA."""
    seed = seed_of(request)
    tile = config.tile_n
    lens = [1, tile, tile + 1, 2 * tile + 5]
    case = make_case(seed, lens, num_heads=8, num_kv_heads=2, head_dim=32, block_size=block_size, dtype=F16)
    out = case.poisoned_out()
    paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                           num_splits=3, tile_size=tile, num_warps=config.num_warps,
                           num_stages=config.num_stages, out=out)
    assert_matches(out, case.reference(), F16, seed)
    assert last_kernel_config() == config.as_dict()


@pytest.mark.parametrize("dtype,group,head_dim,sliding_window,alibi,num_splits", [
    (F16, (1, 2), 128, None, False, 1),
    (BF16, (4, 2), 80, 33, False, 3),
    (F32, (8, 1), 256, None, True, 1),
    (F16, (4, 1), 64, 20, True, 2),
])
def test_contiguous_decode_matches_float64_reference(request, dtype, group, head_dim, sliding_window, alibi,
                                                     num_splits):
    seed = seed_of(request)
    ratio, kv_heads = group
    case = make_case(seed, [1, 15, 16, 17, 150], num_heads=ratio * kv_heads, num_kv_heads=kv_heads,
                     head_dim=head_dim, block_size=16, dtype=dtype, sliding_window=sliding_window, alibi=alibi)
    out = case.poisoned_out()
    contiguous_decode_attention(case.q, case.k_contig, case.v_contig, case.seq_starts, case.context_lens,
                                num_splits=num_splits, out=out, **case.kwargs())
    assert_matches(out, case.reference(paged=False), dtype, seed)


@pytest.mark.parametrize("block_size,num_splits", [(1, 1), (16, 3), (256, 2)])
def test_paged_and_contiguous_compute_identically(request, block_size, num_splits):
    """Same kernel body, same tiles: on the same logical K/V the outputs are bit-identical."""
    seed = seed_of(request)
    case = make_case(seed, ragged_lens(block_size, long=2 * block_size + 37), num_heads=8, num_kv_heads=2,
                     head_dim=80, block_size=block_size, dtype=F16, sliding_window=100, alibi=True)
    paged = paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                                   num_splits=num_splits, out=case.poisoned_out(), **case.kwargs())
    contig = contiguous_decode_attention(case.q, case.k_contig, case.v_contig, case.seq_starts,
                                         case.context_lens, num_splits=num_splits, out=case.poisoned_out(),
                                         **case.kwargs())
    assert not torch.isnan(paged).any()
    assert torch.equal(paged, contig)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    block_size=st.sampled_from(BLOCK_SIZES), head_dim=st.sampled_from(HEAD_DIMS),
    dtype=st.sampled_from(DTYPES), group=st.sampled_from([1, 2, 3, 4, 8]), kv_heads=st.sampled_from([1, 2]),
    lens=st.lists(st.integers(0, 200), min_size=1, max_size=4),
    sliding_window=st.none() | st.integers(1, 120), alibi=st.booleans(),
    num_splits=st.integers(1, 5), seed=st.integers(0, 2**31 - 1),
)
def test_random_configurations_match_reference(block_size, head_dim, dtype, group, kv_heads, lens,
                                               sliding_window, alibi, num_splits, seed):
    case = make_case(seed, lens, num_heads=group * kv_heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     block_size=block_size, dtype=dtype, sliding_window=sliding_window, alibi=alibi)
    out = case.poisoned_out()
    paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                           num_splits=num_splits, out=out, **case.kwargs())
    assert_matches(out, case.reference(), dtype, seed)


def test_zero_context_gives_zeros_and_default_scale_is_inverse_sqrt(request):
    seed = seed_of(request)
    case = make_case(seed, [0, 5, 40], num_heads=2, num_kv_heads=2, head_dim=64, block_size=8, dtype=F32)
    out = paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                                 out=case.poisoned_out(), num_splits=2)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_matches(out, case.reference(scale=64 ** -0.5), F32, seed)
    scaled = paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                                    scale=0.3, out=case.poisoned_out())
    assert_matches(scaled, case.reference(scale=0.3), F32, seed)


def test_strided_views_of_q_and_caches(request):
    """q sliced out of a fused qkv tensor, caches as views of one [2, ...] KV tensor."""
    seed = seed_of(request)
    case = make_case(seed, [3, 16, 70], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=F16)
    qkv = torch.full((3, 8, 64), float("nan"), dtype=F16, device=DEVICE)
    qkv[:, :4] = case.q
    kv = torch.stack([case.k_paged, case.v_paged])
    out = paged_decode_attention(qkv[:, :4], kv[0], kv[1], case.block_tables, case.context_lens.long())
    assert_matches(out, case.reference(), F16, seed)


def test_float32_torch_backend_matches_reference(request):
    """backend='torch' (the CPU execution path) runs the reference in float32."""
    seed = seed_of(request)
    case = make_case(seed, [1, 9, 50], num_heads=4, num_kv_heads=1, head_dim=80, block_size=4, dtype=BF16,
                     sliding_window=30, alibi=True)
    out = paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                                 backend="torch", **case.kwargs())
    assert out.dtype == BF16
    assert_matches(out, case.reference(), BF16, seed)
    contig = contiguous_decode_attention(case.q, case.k_contig, case.v_contig, case.seq_starts,
                                         case.context_lens, backend="torch", **case.kwargs())
    assert_matches(contig, case.reference(), BF16, seed)


def test_cpu_without_interpreter_falls_back_to_reference():
    """Without TRITON_INTERPRET the wrappers still work on CPU tensors (the engine's path)."""
    code = (
        "import torch\n"
        "from pagebench.kernels.paged_decode import paged_decode_attention\n"
        "from pagebench.kernels.reference import paged_decode_attention_reference as ref\n"
        "q = torch.randn(2, 4, 64); k = torch.randn(3, 16, 2, 64); v = torch.randn_like(k)\n"
        "bt = torch.tensor([[2, 0], [1, 0]], dtype=torch.int32); lens = torch.tensor([20, 7])\n"
        "assert torch.allclose(paged_decode_attention(q, k, v, bt, lens), ref(q, k, v, bt, lens))\n"
        "try:\n"
        "    paged_decode_attention(q, k, v, bt, lens, backend='triton')\n"
        "except ValueError as e:\n"
        "    assert 'TRITON_INTERPRET' in str(e)\n"
        "else:\n"
        "    raise SystemExit('expected ValueError')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _makespan(jobs: int, work: int, slots: int) -> int:
    """Greedy list scheduling of ``jobs`` equal jobs on ``slots`` identical slots (event order)."""
    free = [0] * slots
    for _ in range(jobs):
        heapq.heappush(free, heapq.heappop(free) + work)
    return max(free)


@pytest.mark.parametrize("num_seqs,kv_programs,context", [
    (64, 8, 8192), (32, 40, 4096), (64, 40, 8192), (32, 8, 4096), (8, 8, 4096), (1, 8, 8192), (132, 3, 4096),
])
def test_split_heuristic_minimises_the_simulated_makespan(num_seqs, kv_programs, context):
    """The chosen split is the smallest that minimises the time of a wave-by-wave schedule of
    equal programs (each ``ceil(tiles / s)`` tiles + the pipeline fill) on SMs x CTAs slots."""
    sms, ctas, config = 132, 3, DECODE_CONFIGS[0]
    tiles, fill = -(-context // config.tile_n), config.num_stages - 1
    allowed = range(1, min(64, tiles) + 1)
    spans = {s: _makespan(num_seqs * kv_programs * s, -(-tiles // s) + fill, sms * ctas) for s in allowed}
    best = min(spans.values())
    chosen = choose_num_splits(num_seqs, kv_programs, context, sms, ctas_per_sm=ctas, config=config)
    assert chosen == min(s for s, span in spans.items() if span == best)


def test_split_heuristic_bounds():
    # exactly one full wave: nothing to gain from splitting
    assert choose_num_splits(num_seqs=132, kv_programs=3, max_context=8192, sms=132, ctas_per_sm=3) == 1
    # one sequence: as many splits as the length allows (>= one 64-token tile each), at most 64
    assert choose_num_splits(num_seqs=1, kv_programs=1, max_context=1024, sms=132) == 16
    assert choose_num_splits(num_seqs=1, kv_programs=1, max_context=10**6, sms=132) == 64
    # two tiles: (1 wave) x (2 + 2 fill) without a split, 1 x (1 + 2) with two one-tile splits
    assert choose_num_splits(num_seqs=2, kv_programs=8, max_context=100, sms=132) == 2
    assert choose_num_splits(num_seqs=2, kv_programs=8, max_context=64, sms=132) == 1
    assert choose_num_splits(num_seqs=0, kv_programs=8, max_context=100, sms=132) == 1
    # 1.2 waves cost two without a split; the chosen split leaves a smaller tail
    assert choose_num_splits(num_seqs=60, kv_programs=8, max_context=8192, sms=132, ctas_per_sm=3) > 1


@pytest.mark.parametrize("registers,shared,warps,expected", [
    (128, 0, 4, 4),            # 65536 / (128 x 128 threads)
    (255, 0, 4, 2),            # registers are allocated in 8s: 256 x 128 threads
    (32, 0, 4, 16),            # 64 warps per SM / 4
    (16, 0, 1, 32),            # at most 32 blocks per SM
    (64, 100 * 1024, 4, 2),    # 228 KB / (100 KB + 1 KB reserved per block)
    (88, 71680, 4, 3),         # the default decode config on sm_90 (compile_check)
])
def test_resident_ctas_follow_the_sm90_occupancy_rules(registers, shared, warps, expected):
    assert resident_ctas_per_sm(registers, shared, warps) == expected


def test_config_selection_is_fixed_and_fits_shared_memory():
    """No autotuning: the config is a function of head dim and dtype (and what the caller fixes)."""
    assert select_config(128, 2) == DECODE_CONFIGS[0]  # tile 64, 4 warps, 3 stages
    assert select_config(256, 2).tile_n == 32  # d256 tiles stay in registers
    assert select_config(256, 4).tile_n == 32  # fp32 d256: 2 x 2 x 32 x 256 x 4 B = 128 KB fits
    assert select_config(512, 4) == FALLBACK_CONFIG  # 2 x 2 x 32 x 512 x 4 B = 256 KB does not
    assert select_config(128, 2, tile_size=128, num_stages=2, num_warps=8) == DECODE_CONFIGS[2]
    assert select_config(128, 2, num_warps=8) == DECODE_CONFIGS[0].__class__(64, 8, 3)


@pytest.mark.parametrize("heads,group_rows", [((32, 32), 16), ((32, 8), 16), ((64, 8), 16), ((32, 1), 32),
                                              ((16, 1), 16), ((72, 1), 64)])
def test_each_kv_head_is_read_by_one_program_per_query_group(heads, group_rows):
    """The grid has one program per (sequence, KV head, split): a program's tl.dot holds the
    whole query group (padded to >= 16 rows), so K/V is read once per group, not once per
    query head; only a group larger than 64 rows (MQA with 72 heads) needs a second chunk."""
    num_heads, kv_heads = heads
    plan = launch_plan(4, num_heads, kv_heads, 128, max_context=4096, sms=132)
    assert plan.block_m == group_rows
    assert plan.grid(4, kv_heads) == (4, kv_heads * (2 if num_heads // kv_heads > 64 else 1), plan.num_splits)


@pytest.mark.parametrize("batch,context,splits", [(1, 1024, 16), (1, 4096, 32), (1, 8192, 43), (8, 1024, 6),
                                                  (8, 8192, 6), (32, 4096, 3), (64, 8192, 3)])
def test_split_heuristic_fills_the_h200_at_small_batch(batch, context, splits):
    """llama-3-8b (8 KV heads) on 132 SMs x 3 CTAs: at batch 1-8 the splits put >= 128
    programs on the GPU (>= 0.97 of the SMs busy); the figures are the wave model's arithmetic."""
    plan = launch_plan(batch, 32, 8, 128, max_context=context, sms=132)
    assert plan.num_splits == splits
    programs = batch * 8 * splits
    assert programs >= 128


# ---- input validation ----------------------------------------------------------------------


def _valid_inputs():
    q = torch.randn(2, 4, 64)
    k = torch.randn(5, 16, 2, 64)
    return {"q": q, "k_cache": k, "v_cache": torch.randn_like(k),
            "block_tables": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
            "context_lens": torch.tensor([20, 3], dtype=torch.int32)}


BAD_INPUTS = [
    ("q 2-D", lambda a: a.update(q=a["q"][0]), "q must be"),
    ("cache 3-D", lambda a: a.update(k_cache=a["k_cache"][0], v_cache=a["v_cache"][0]), "k_cache must be"),
    ("v shape", lambda a: a.update(v_cache=a["v_cache"][:4]), "v_cache shape"),
    ("dtype mismatch", lambda a: a.update(k_cache=a["k_cache"].half()), "share one dtype"),
    ("int q", lambda a: a.update(q=a["q"].int()), "supported: float16"),
    ("block size 3", lambda a: a.update(k_cache=torch.randn(5, 3, 2, 64), v_cache=torch.randn(5, 3, 2, 64)),
     "power of two"),
    ("block size 512", lambda a: a.update(k_cache=torch.randn(1, 512, 2, 64), v_cache=torch.randn(1, 512, 2, 64)),
     "power of two in 1..256"),
    ("heads", lambda a: a.update(q=torch.randn(2, 3, 64)), "multiple of num_kv_heads"),
    ("head dim", lambda a: a.update(q=torch.randn(2, 4, 32)), "head_dim of q"),
    ("head dim 512", lambda a: a.update(q=torch.randn(2, 4, 512), k_cache=torch.randn(5, 16, 2, 512),
                                        v_cache=torch.randn(5, 16, 2, 512)), "head_dim must be in"),
    ("strided cache", lambda a: a.update(k_cache=torch.randn(5, 16, 2, 128)[..., ::2],
                                         v_cache=torch.randn(5, 16, 2, 128)[..., ::2]), "contiguous in head_dim"),
    ("float table", lambda a: a.update(block_tables=a["block_tables"].float()), "int32 or int64"),
    ("table rows", lambda a: a.update(block_tables=a["block_tables"][:1]), "block_tables has 1 rows"),
    ("lens length", lambda a: a.update(context_lens=a["context_lens"][:1]), "context_lens has 1 entries"),
    ("lens too long", lambda a: a.update(context_lens=torch.tensor([33, 3])), "context_lens must be in"),
    ("negative lens", lambda a: a.update(context_lens=torch.tensor([-1, 3])), "context_lens must be in"),
    ("block id", lambda a: a.update(block_tables=torch.tensor([[0, 9], [2, 3]], dtype=torch.int32)),
     "block ids outside"),
    ("alibi shape", lambda a: a.update(alibi_slopes=torch.ones(3)), "alibi_slopes"),
    ("window 0", lambda a: a.update(sliding_window=0), "sliding_window"),
    ("splits 0", lambda a: a.update(num_splits=0), "num_splits"),
    ("tile 24", lambda a: a.update(tile_size=24), "tile_size"),
    ("scale", lambda a: a.update(scale=float("nan")), "scale"),
    ("out shape", lambda a: a.update(out=torch.empty(2, 4, 32)), "out must be"),
    ("backend", lambda a: a.update(backend="cuda"), "backend must be"),
]


@pytest.mark.parametrize("mutate,match", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_paged_decode_rejects_bad_inputs(mutate, match):
    args = _valid_inputs()
    mutate(args)
    with pytest.raises(ValueError, match=match):
        paged_decode_attention(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("block_tables"),
                               args.pop("context_lens"), **args)


def test_contiguous_decode_rejects_out_of_range_slots():
    q, k = torch.randn(2, 4, 64), torch.randn(40, 2, 64)
    with pytest.raises(ValueError, match="seq_start"):
        contiguous_decode_attention(q, k, k, torch.tensor([0, 30]), torch.tensor([10, 11]))
    with pytest.raises(ValueError, match="seq_starts has 1 entries"):
        contiguous_decode_attention(q, k, k, torch.tensor([0]), torch.tensor([10, 11]))


# ---- real sizes, compiled kernels -----------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("block_size", [1, 8, 16, 32, 128, 256])
@pytest.mark.parametrize("heads", [(40, 40, 128), (32, 8, 128), (32, 4, 80), (16, 1, 256)])
def test_gpu_real_sizes_with_heuristic_splits(request, block_size, heads):
    """Llama-like head configs, ragged contexts up to 5k, the heuristic picks the split (the
    default config)."""
    seed = seed_of(request)
    num_heads, kv_heads, head_dim = heads
    lens = [1, block_size + 1, 777, 4099, 5000]
    case = make_case(seed, lens, num_heads=num_heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     block_size=block_size, dtype=F16)
    out = paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                                 num_warps=4, out=case.poisoned_out())
    assert_matches(out, case.reference(), F16, seed)
    contig = contiguous_decode_attention(case.q, case.k_contig, case.v_contig, case.seq_starts,
                                         case.context_lens, max_context_len=block_size * case.block_tables.shape[1],
                                         num_warps=4, out=case.poisoned_out())
    assert_matches(contig, case.reference(), F16, seed)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("heads", [(40, 40, 128), (32, 8, 128)])
def test_gpu_default_config_matches_reference_and_says_which_config_ran(request, heads):
    seed = seed_of(request)
    num_heads, kv_heads, head_dim = heads
    case = make_case(seed, [1, 17, 4099, 5000], num_heads=num_heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     block_size=16, dtype=F16)
    out = paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables, case.context_lens,
                                 out=case.poisoned_out())
    assert_matches(out, case.reference(), F16, seed)
    assert last_kernel_config() == DECODE_CONFIGS[0].as_dict()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_cuda_graph_capture_and_replay(request):
    """The wrapper launches nothing that syncs, so it can be captured in a CUDA graph."""
    seed = seed_of(request)
    case = make_case(seed, [100, 2000, 3000], num_heads=32, num_kv_heads=8, head_dim=128, block_size=16,
                     dtype=BF16)
    out = case.poisoned_out()
    call = lambda: paged_decode_attention(case.q, case.k_paged, case.v_paged, case.block_tables,  # noqa: E731
                                          case.context_lens, out=out)
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(out, case.reference(), BF16, seed)
