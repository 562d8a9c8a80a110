"""The model: cached (paged) decoding equals full recomputation without any cache."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from harness.config.specs import ModelSpec
from harness.engine.model import (DecoderModel, dense_causal_attention, exact_decode_attention)
from harness.engine.torch_device import get_model
from pagebench.kernels.reference import paged_decode_attention_reference
from torch_helpers import (TINY, _request, dense_greedy, engine, one_torch_thread, paged,  # noqa: F401
                           run_torch)


def _requests():
    rng = np.random.default_rng(11)
    # prompt lengths around block boundaries (block 16): 1, 15, 16, 17, 33
    return tuple(_request(i, rng.integers(0, 1 << 29, n, dtype=np.int32), out)
                 for i, (n, out) in enumerate([(1, 12), (15, 10), (16, 9), (17, 14), (33, 8)]))


def test_paged_decode_equals_dense_recompute_token_for_token():
    requests = _requests()
    result = run_torch(requests, paged(16))
    model = result.executor.model
    assert model.batch_invariant  # the CPU default
    for request in requests:
        expected = dense_greedy(model, request.prompt_token_ids, request.output_len)
        assert result.tokens[request.request_id] == [expected], request.request_id


def test_kernel_path_in_fp32_agrees_with_dense_up_to_near_ties():
    """batch_invariant off: the kernels' public wrappers (torch reference on CPU) in fp32."""
    requests = _requests()
    result = run_torch(requests, paged(16), engine(batch_invariant=False))
    model = result.executor.model
    assert not model.batch_invariant
    for request in requests:
        generated = result.tokens[request.request_id][0]
        sequence = np.concatenate([request.prompt_token_ids, generated]).astype(np.int64)
        logits = model.dense_logits(torch.from_numpy(sequence))  # [len, vocab]
        start = request.prompt_len - 1
        for t, token in enumerate(generated):
            row = logits[start + t]
            top2 = torch.topk(row, 2).values
            # a different argmax is only acceptable at an fp32 near-tie
            assert int(torch.argmax(row)) == token or float(top2[0] - top2[1]) < 1e-3


def test_exact_decode_equals_prefill_path_bitwise():
    """A token's attention is the same whether computed in a prefill chunk or by decode
    through a scrambled block table: the property that makes paged == contiguous exact."""
    gen = torch.Generator().manual_seed(0)
    length, heads, kv_heads, dim, block = 37, 4, 2, 32, 8
    q = torch.randn(length, heads, dim, generator=gen)
    k = torch.randn(length, kv_heads, dim, generator=gen)
    v = torch.randn(length, kv_heads, dim, generator=gen)
    full = dense_causal_attention(q, k, v, 0, batch_invariant=True)
    # paged cache: positions scattered over blocks in a random order, other slots NaN
    num_blocks = 12
    table = torch.randperm(num_blocks, generator=gen)[: -(-length // block)]
    cache_k = torch.full((num_blocks * block, kv_heads, dim), float("nan"))
    cache_v = cache_k.clone()
    slots = table[torch.arange(length) // block] * block + torch.arange(length) % block
    cache_k[slots], cache_v[slots] = k, v
    lens = list(range(1, length + 1))
    slot_index = slots[None, :].expand(length, length)
    decoded = exact_decode_attention(q, cache_k, cache_v, slot_index, lens, 1 / math.sqrt(dim))
    assert torch.equal(decoded, full)
    # chunked: the second half as a chunk over the cached first half
    half = length // 2
    chunk = dense_causal_attention(q[half:], k, v, half, batch_invariant=True)
    assert torch.equal(chunk, full[half:])


def test_exact_decode_matches_kernel_reference():
    gen = torch.Generator().manual_seed(1)
    num_seqs, heads, kv_heads, dim, block, num_blocks = 5, 8, 2, 32, 16, 40
    k_cache = torch.randn(num_blocks, block, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block, kv_heads, dim, generator=gen)
    lens = [1, 15, 16, 17, 100]
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:7] for _ in lens]).int()
    q = torch.randn(num_seqs, heads, dim, generator=gen)
    positions = torch.arange(max(lens))
    slot_index = tables.long()[:, positions // block] * block + positions % block
    ours = exact_decode_attention(q, k_cache.view(-1, kv_heads, dim), v_cache.view(-1, kv_heads, dim),
                                  slot_index, lens, 1 / math.sqrt(dim))
    ref = paged_decode_attention_reference(q, k_cache, v_cache, tables, torch.tensor(lens),
                                           compute_dtype=torch.float64)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)


def test_sdpa_prefill_path_matches_exact_path():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(9, 4, 32, generator=gen)
    k = torch.randn(20, 2, 32, generator=gen)
    v = torch.randn(20, 2, 32, generator=gen)
    fast = dense_causal_attention(q, k, v, 11)
    exact = dense_causal_attention(q, k, v, 11, batch_invariant=True)
    torch.testing.assert_close(fast, exact, rtol=1e-5, atol=1e-5)


def test_weights_are_seeded_and_variants_build():
    a = DecoderModel(TINY, seed=3)
    b = DecoderModel(TINY, seed=3)
    c = DecoderModel(TINY, seed=4)
    assert torch.equal(a.layers[1].wqkv, b.layers[1].wqkv)
    assert not torch.equal(a.layers[1].wqkv, c.layers[1].wqkv)
    opt_like = ModelSpec(name="gelu", num_layers=3, num_layers_override=1, hidden_size=64,
                         num_heads=4, num_kv_heads=4, head_dim=16, intermediate_size=96,
                         vocab_size=300, max_context=64, mlp="gelu", tied_embeddings=True,
                         dtype="bfloat16")
    model = DecoderModel(opt_like)
    assert len(model.layers) == 1 and model.lm_head is model.embed
    logits = model.dense_logits(torch.arange(10) * 1000)  # ids beyond the vocab wrap around
    assert logits.shape == (10, 300) and torch.isfinite(logits).all()
    norms = (2 * 1 + 1) * 64 * 2  # two RMSNorm weights per layer + the final one, bf16
    assert model.weight_bytes == opt_like.weight_bytes + norms


def test_model_cache_builds_once_per_setting():
    device = torch.device("cpu")
    assert get_model(TINY, device, 0, True) is get_model(TINY, device, 0, True)
    assert get_model(TINY, device, 1, True) is not get_model(TINY, device, 0, True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_matches_dense_recompute():
    """On CUDA: Triton decode kernel + SDPA prefill in fp32 vs dense recompute (near-ties aside)."""
    requests = _requests()
    result = run_torch(requests, paged(16), engine(device="cuda"))
    model = result.executor.model
    for request in requests:
        generated = result.tokens[request.request_id][0]
        sequence = np.concatenate([request.prompt_token_ids, generated]).astype(np.int64)
        logits = model.dense_logits(torch.from_numpy(sequence).cuda()).cpu()
        for t, token in enumerate(generated):
            row = logits[request.prompt_len - 1 + t]
            top2 = torch.topk(row, 2).values
            assert int(torch.argmax(row)) == token or float(top2[0] - top2[1]) < 1e-2
