"""KV block residency: lifetimes, idle time before eviction and reuse gaps on a small pool
against a hand trace, through the engine against its own step and request tables, and
the same figures with fast-forward on and off."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine_helpers import engine_spec, make_requests, paged, run
from harness.metrics.residency import distribution, residency_summary
from pagebench.allocators.block_pool import BlockPool
from pagebench.allocators.residency import ResidencyLog
from test_engine_fast_forward import CASES, COSTS, _chat_requests, _workload


def test_a_small_pool_against_a_hand_trace():
    pool = BlockPool(4)
    log = pool.residency = ResidencyLog(4)
    log.now = 0.0
    assert pool.allocate(2) == [0, 1]
    pool.register(0, key=100)
    pool.register(1, key=101)
    log.now = 1.5
    pool.free([1, 0])  # tail first: queue 2, 3, 1, 0
    assert list(log.lifetimes) == [1.5, 1.5]
    log.now = 2.0
    pool.touch(0)  # a prompt hit on a free cached block: 0.5 s after its release
    assert list(log.reuse_gaps) == [0.5]
    log.now = 4.0
    assert pool.allocate(3) == [2, 3, 1]  # 1 still held key 101: evicted after 2.5 s free
    assert list(log.idle_before_evict) == [2.5]
    log.now = 7.0
    pool.free([0, 1, 3, 2])
    # block 0 in use since its hit at 2.0; 1, 2, 3 since 4.0
    assert list(log.lifetimes) == [1.5, 1.5, 5.0, 3.0, 3.0, 3.0]
    summary = residency_summary([SimpleNamespace(pool=pool)])
    assert summary["cached_free_at_end"] == 1 and summary["in_use_at_end"] == 0
    assert summary["kv_block_lifetime_seconds"]["count"] == 6
    assert summary["kv_block_lifetime_seconds"]["p50"] == 3.0  # numpy's linear percentile


def test_distribution_figures():
    from array import array
    d = distribution(array("d", [1.0, 2.0, 3.0, 4.0]))
    assert (d["count"], d["mean"], d["p50"], d["max"]) == (4, 2.5, 2.5, 4.0)
    assert d["p90"] == pytest.approx(3.7) and d["p99"] == pytest.approx(3.97)
    assert sum(d["histogram"]["counts"]) == 4 and d["histogram"]["edges"][-1] == 4.0
    assert distribution(array("d"))["p50"] is None


@pytest.mark.parametrize("fast_forward", [False, True])
def test_one_request_through_the_engine(fast_forward):
    """A 20-token prompt and 14 output tokens in 16-token blocks: blocks 0 and 1 are taken
    at the first step's start (its arrival), block 2 at the step that writes position 32
    (step 13: step 0 writes 0..19, decode step i writes 19 + i), all freed as it finishes."""
    requests = make_requests([(20, 14)])
    result = run(requests, paged(16), engine_spec(fast_forward=fast_forward, kv_capacity_slots=256))
    log = result.scheduler.manager.pool.residency
    steps, reqs = result.recorder.step_table(), result.recorder.request_table()
    assert len(steps) == 14
    finish, arrival = reqs["finish_s"][0], reqs["arrival_s"][0]
    assert sorted(log.lifetimes) == sorted([finish - arrival, finish - arrival,
                                            finish - steps["time_s"][13]])
    assert list(log.idle_before_evict) == [] and list(log.reuse_gaps) == []


def test_a_later_request_reuses_the_cached_prefix_after_the_gap():
    """Two requests with the same 40-token prompt, the second arriving 5 s after the first
    finishes: its two full prompt blocks are hits on free cached blocks, 5 s after release."""
    prefix = np.arange(40, dtype=np.int32)
    first = make_requests([(40, 4)], prefix=prefix)
    alone = run(first, paged(16, prefix_caching=True), engine_spec(kv_capacity_slots=256))
    end = alone.recorder.request_table()["finish_s"][0]
    requests = make_requests([(40, 4), (40, 4)], prefix=prefix)
    later = (requests[0], type(requests[1])(1, end + 5.0, requests[1].prompt_token_ids, 4))
    result = run(later, paged(16, prefix_caching=True), engine_spec(kv_capacity_slots=256))
    log = result.scheduler.manager.pool.residency
    assert list(log.reuse_gaps) == pytest.approx([5.0, 5.0], abs=1e-9)


def _residency(result) -> tuple:
    log = result.scheduler.manager.pool.residency
    return tuple(sorted(values) for values in (log.lifetimes, log.idle_before_evict, log.reuse_gaps))


@pytest.mark.parametrize("case", [c for c in sorted(CASES) if c.startswith(("paged", "swap", "chunked"))])
def test_fast_forward_gives_the_same_residency(case):
    system, overrides = CASES[case]
    requests = _workload(seed=len(case), gap=0.02, prefix_len=48 if "prefix" in case else 0)
    base = dict(kv_capacity_slots=4096, cost=COSTS["fa_before"])
    base.update(overrides)
    slow = run(requests, system, engine_spec(fast_forward=False, **base), max_model_len=1024)
    fast = run(requests, system, engine_spec(fast_forward=True, **base), max_model_len=1024)
    assert _residency(slow) == _residency(fast)
    assert len(_residency(fast)[0]) > 0


@pytest.mark.parametrize("capacity", [1024, 2048])
def test_fast_forward_gives_the_same_residency_on_chat_with_evictions(capacity):
    system = paged(16, prefix_caching=True)
    spec = dict(kv_capacity_slots=capacity)
    slow = run(_chat_requests(1), system, engine_spec(fast_forward=False, **spec))
    fast = run(_chat_requests(1), system, engine_spec(fast_forward=True, **spec))
    assert _residency(slow) == _residency(fast)
    assert len(_residency(fast)[1]) > 0 and len(_residency(fast)[2]) > 0  # evictions and hits


def test_the_report_shows_a_table_and_histograms_for_the_systems_that_recorded():
    from pagebench.reports.residency_section import residency_histograms, residency_parts
    pool = BlockPool(2)
    log = pool.residency = ResidencyLog(2)
    pool.allocate(2)
    log.now = 1.0
    pool.free([1, 0])
    systems = {"paged": {"kv_residency": residency_summary([SimpleNamespace(pool=pool)])}, "max": {}}
    parts = residency_parts(systems, {"paged": "C0"})
    assert "residency-table" in parts[2] and ">2<" in parts[2]  # two lifetime samples
    assert residency_parts({"max": {}}, {}) == []
    fig = residency_histograms({"paged": systems["paged"]["kv_residency"]}, {"paged": "C0"})
    assert len(fig.axes) == 3
