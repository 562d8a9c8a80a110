"""The paged manager with prefix caching reads the ids it keys from each sequence's token
source (``Capabilities.token_sources``): the scheduler and fast-forward build no decode
ids for it. Every run here equals the run in which the manager is given every id (the
capabilities patched to ``reads_decode_tokens=True, token_sources=False``, today's
general path): step and request rows, the output digest, and the manager's prefix cache
after the run (every key a block got, on which block, the free queue, the eviction log).
The runs preempt by recompute (a re-admitted prompt hits its own decode blocks) and by
swap, fork parallel samples and beams, and decode chat answers a later turn repeats (ids
the workload gives).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

import engine_helpers
from engine_helpers import engine_spec, make_requests, paged, run
from harness.engine.sequence import SYNTHETIC_TOKEN_BASE, Sequence, SequenceGroup
from harness.workloads.request import Request
from test_engine_fast_forward import _chat_requests


def _run(monkeypatch, requests, spec, *, sources: bool):
    """The run and its manager, with token sources as declared (``sources``) or patched
    off (every id given, as before them)."""
    build = engine_helpers.build_manager
    managers = []

    def build_with(*args, **kwargs):
        manager = build(*args, **kwargs)
        assert manager.capabilities.token_sources and not manager.capabilities.reads_decode_tokens
        if not sources:
            manager.capabilities = dataclasses.replace(
                manager.capabilities, reads_decode_tokens=True, token_sources=False)
        append_decode = manager.append_decode

        def spy(seq_ids, token_ids, copies):
            seen.add(type(token_ids))
            return append_decode(seq_ids, token_ids, copies)

        manager.append_decode = spy
        managers.append(manager)
        return manager

    seen: set[type] = set()  # the types of the token ids append_decode got
    with monkeypatch.context() as patch:
        patch.setattr(engine_helpers, "build_manager", build_with)
        result = run(requests, paged(16, prefix_caching=True), spec, max_model_len=2048)
    # (the scheduler builds ids only without sources; multi-sequence groups take no decode runs)
    assert seen <= {type(None) if sources else list}
    return result, managers[0]


def _cache(manager) -> dict:
    pool = manager.pool
    return {"keys": list(pool._keys), "cached": dict(pool._cached), "queue": pool.free_queue(),
            "evicted": pool.evicted_since(0), "stats": manager.stats}


def _assert_same_as_given_ids(monkeypatch, requests, **spec):
    spec = engine_spec(**spec)
    given, given_manager = _run(monkeypatch, requests, spec, sources=False)
    read, read_manager = _run(monkeypatch, requests, spec, sources=True)
    pd.testing.assert_frame_equal(given.recorder.step_table(), read.recorder.step_table(),
                                  check_exact=True)
    requests_given = given.recorder.request_table()
    pd.testing.assert_frame_equal(requests_given, read.recorder.request_table(),
                                  check_exact=True)
    assert given.output_digest == read.output_digest
    assert _cache(given_manager) == _cache(read_manager)
    return requests_given, given_manager


def _lengths(seed: int, n: int, prompt: int, output: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return [(int(p), int(o)) for p, o in zip(rng.integers(1, prompt, n), rng.integers(1, output, n))]


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("fast_forward", [True, False])
def test_preempted_runs_key_the_same_blocks(monkeypatch, preemption, fast_forward):
    requests = make_requests(_lengths(3, 60, 200, 300), gap=0.002,
                             prefix=np.arange(40, dtype=np.int32), seed=3)
    table, _ = _assert_same_as_given_ids(
        monkeypatch, requests, kv_capacity_slots=1024, preemption=preemption,
        fast_forward=fast_forward)
    if preemption == "swap":
        assert table["swaps"].sum() > 0
    else:  # some re-admitted prompt hit decode blocks (beyond its prompt and the prefix)
        assert table["preemptions"].sum() > 0
        assert (table["cached_tokens"] > table["prompt_len"] + 40).any()


@pytest.mark.parametrize("beams", [False, True])
def test_forked_sequences_key_the_same_blocks(monkeypatch, beams):
    requests = make_requests(_lengths(5, 30, 150, 120), gap=0.003, seed=5,
                             num_samples=1 if beams else 3, beam_width=3 if beams else 1)
    _assert_same_as_given_ids(monkeypatch, requests, kv_capacity_slots=2048)


@pytest.mark.parametrize("seed", [0, 1])
def test_chat_answers_the_workload_gives_key_the_same_blocks(monkeypatch, seed):
    """Later turns hit the blocks an answer filled while decoding (fast-forward's shared
    keys path) and evict cached blocks mid-span."""
    _assert_same_as_given_ids(monkeypatch, _chat_requests(seed), kv_capacity_slots=1536)


def test_token_run_reads_as_token_ids():
    """``Sequence.token_run`` (the token source) gives ``token_ids``' ids as packed 4-byte
    ints: prompt and generated positions, ids that wrap around ``SYNTHETIC_TOKEN_BASE``,
    ids the workload gives, and stored ones."""
    from array import array

    prompt = np.arange(5, dtype=np.int32)
    given = np.arange(10_000, 10_040, dtype=np.int32)
    plain, workload = Request(0, 0.0, prompt, 40), Request(1, 0.0, prompt, 40, output_token_ids=given)
    seqs = []
    for request, offset, stored in [(plain, None, None), (workload, None, None),
                                    (plain, SYNTHETIC_TOKEN_BASE - 9, None),
                                    (plain, None, array("q", [1, 2, 3]))]:
        seq = Sequence(len(seqs), SequenceGroup(request), 0, stored)
        seq.group.seqs.append(seq)
        if offset is not None:
            seq.synthetic_offset = offset
        seq.num_generated = 40
        seqs.append(seq)
    for seq in seqs:
        for start in range(0, 44, 3):
            for end in range(start + 1, 45, 5):
                ids = array("i", seq.token_ids(start, end).tolist())
                assert seq.token_run(start, end) == ids.tobytes()
