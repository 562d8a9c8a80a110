"""The paging is right: every paged configuration generates exactly the contiguous oracle's tokens.

The tiny model runs in fp32 on CPU through the real engine; the paged system reads its KV
through block tables (decode) and slot mappings (prefill), the oracle through one
contiguous extent per sequence. With batch-invariant arithmetic (the CPU default), any
difference in a single token means some KV was written to or read from the wrong slot.
KV memory starts as NaN, so reading a slot nobody wrote cannot pass either.
"""

from __future__ import annotations

import pytest

from torch_helpers import (beam_workload, contiguous, engine, mixed_workload, one_torch_thread,  # noqa: F401
                           paged, run_torch)

BLOCK_SIZES = (1, 16, 64)


@pytest.fixture(scope="module")
def oracle():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = run_torch(mixed_workload(), contiguous("oracle"))
    finally:
        torch.set_num_threads(threads)
    assert result.run.rejected == {} and result.run.complete
    assert result.scheduler.num_preemptions == 0
    return result


def _assert_same_tokens(result, oracle) -> None:
    assert result.run.rejected == {}, "a rejected request would make the comparison vacuous"
    assert result.tokens == oracle.tokens
    assert result.digest == oracle.digest


def test_oracle_generates_every_requested_token(oracle):
    for request in mixed_workload():
        samples = oracle.tokens[request.request_id]
        assert len(samples) == request.num_samples
        assert all(len(s) == request.output_len for s in samples)
    # parallel samples really diverge (seeded sampling), so copy-on-write is exercised
    diverged = [s for s in oracle.tokens.values() if len(s) > 1 and len(s[0]) > 2]
    assert diverged and all(len({tuple(x) for x in s}) > 1 for s in diverged)


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no_prefix_cache", "prefix_cache"])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_paged_matches_contiguous_oracle(oracle, block_size, prefix_caching):
    result = run_torch(mixed_workload(), paged(block_size, prefix_caching))
    _assert_same_tokens(result, oracle)
    if block_size > 1:
        assert result.executor.manager.stats.cow_copies > 0  # forked samples diverged in a shared block
    if prefix_caching and block_size <= 16:
        assert result.scheduler.prompt_tokens_cached > 0  # prefix KV was read from the cache


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no_prefix_cache", "prefix_cache"])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_paged_matches_oracle_under_preemption(oracle, block_size, prefix_caching, preemption):
    spec = engine(kv_capacity_slots=384, preemption=preemption)
    result = run_torch(mixed_workload(), paged(block_size, prefix_caching), spec)
    assert result.scheduler.num_preemptions > 0
    if preemption == "swap":
        assert result.scheduler.num_swaps > 0  # KV went to the CPU pool and came back
    _assert_same_tokens(result, oracle)


@pytest.mark.parametrize("policy,capacity", [("pow2", 512), ("max", 4096)])
def test_contiguous_policies_with_swap_match_oracle(oracle, policy, capacity):
    """Contiguous fork copies (per slot) and, for pow2 in a small arena, slot swaps."""
    result = run_torch(mixed_workload(), contiguous(policy), engine(kv_capacity_slots=capacity,
                                                                    preemption="swap"))
    assert result.executor.manager.stats.fork_copies > 0
    _assert_same_tokens(result, oracle)


def test_chunked_prefill_reads_earlier_chunks_from_the_cache(oracle):
    spec = engine(chunked_prefill=True, max_num_batched_tokens=40)  # samples need a whole prefill
    result = run_torch(mixed_workload(), paged(16, prefix_caching=True), spec)
    _assert_same_tokens(result, oracle)


def test_resident_block_tables_match_oracle(oracle):
    spec = engine(block_tables_on_device=True, kv_capacity_slots=384, preemption="swap")
    result = run_torch(mixed_workload(), paged(16, prefix_caching=True), spec)
    _assert_same_tokens(result, oracle)
    report = result.executor.report()
    assert report["block_tables_on_device"] is True
    assert 0 < report["block_table_rows_uploaded_pct"] < 100  # only changed rows went up


def test_beam_search_forks_match_between_paged_and_contiguous():
    requests = beam_workload()
    reference = run_torch(requests, contiguous("oracle"))
    assert reference.executor.manager.stats.fork_copies > 0
    result = run_torch(requests, paged(16, prefix_caching=True), engine(kv_capacity_slots=200))
    assert result.scheduler.num_preemptions > 0
    assert result.tokens == reference.tokens


def test_greedy_sampling_gives_identical_samples():
    requests = mixed_workload(n=4)
    result = run_torch(requests, paged(16), engine(sampling="greedy"))
    for samples in result.tokens.values():
        assert all(s == samples[0] for s in samples)
