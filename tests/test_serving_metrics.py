"""vLLM-named serving figures, ITL from token breaks, goodput and SLO attainment
(harness.metrics.latency) on hand-built step and request tables, and the slo config."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.config.specs import SloSpec, build_spec
from harness.errors import ConfigError
from harness.metrics.latency import inter_token_latencies, serving_metrics
from harness.metrics.summaries import REQUEST_COLUMNS


def steps_of(durations: list[float], start: float = 0.0) -> pd.DataFrame:
    """Back-to-back steps from ``start`` (the engine's clock: start += duration)."""
    times, now = [], start
    for d in durations:
        times.append(now)
        now += d
    return pd.DataFrame({"time_s": times, "duration_s": durations})


def request(rid: int, arrival: float, first: float | None, finish: float | None, out: int,
            status: str = "finished", seqs: int = 1) -> tuple:
    return (rid, f"r{rid}", arrival, first, finish, 100, out, seqs, 0, 0, 0, status)


def table(*rows: tuple) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(REQUEST_COLUMNS))


# steps of 0.5, 1, 1, 2, 0.5, 1 s: ends at 0.5, 1.5, 2.5, 4.5, 5.0, 6.0
STEPS = steps_of([0.5, 1.0, 1.0, 2.0, 0.5, 1.0])


def test_itl_of_an_unbroken_request_is_each_steps_duration():
    # first token at the end of step 0 (0.5 s), then one per step up to step 3 (4.5 s)
    reqs = table(request(0, 0.0, 0.5, 4.5, 4))
    assert inter_token_latencies(STEPS, reqs).tolist() == [1.0, 1.0, 2.0]


def test_itl_across_a_break_spans_the_steps_without_a_token():
    # tokens at steps 0 and 1 (0.5, 1.5 s); preempted at step 2 (starts at 1.5 s) with 2
    # tokens; back at step 4 (5.0 s) and step 5 (6.0 s): 4 tokens
    reqs = table(request(7, 0.0, 0.5, 6.0, 4))
    gaps = inter_token_latencies(STEPS, reqs, {7: [(1.5, 2)]})
    assert gaps.tolist() == [1.0, 5.0 - 1.5, 1.0]
    # two breaks with no token between them add nothing: the same gaps
    again = inter_token_latencies(STEPS, reqs, {7: [(1.5, 2), (2.5, 2)]})
    assert again.tolist() == gaps.tolist()


def test_itl_leaves_out_unfinished_and_multi_sequence_requests():
    reqs = table(request(0, 0.0, 0.5, 2.5, 3), request(1, 0.0, 0.5, 2.5, 3, seqs=2),
                 request(2, 0.0, None, None, 3, status="rejected"))
    assert inter_token_latencies(STEPS, reqs).tolist() == [1.0, 1.0]


def test_breaks_that_disagree_with_the_steps_are_an_invariant_error():
    reqs = table(request(0, 0.0, 0.5, 6.0, 3))  # 3 tokens cannot span steps 0 .. 5
    with pytest.raises(RuntimeError):
        inter_token_latencies(STEPS, reqs)


def hand_table() -> pd.DataFrame:
    """Four finished requests, one rejected, one unfinished (seconds):

    id  arrival first  finish out  TTFT   E2EL   TPOT
    0   0.0     0.25   1.5    11   0.25   1.5    0.125
    1   0.0     0.625  0.625  1    0.625  0.625  - (one token)
    2   1.0     1.5    3.5    5    0.5    2.5    0.5
    3   2.0     2.125  4.0    16   0.125  2.0    0.125
    (binary fractions: the comparisons with the targets are exact)
    """
    return table(request(0, 0.0, 0.25, 1.5, 11), request(1, 0.0, 0.625, 0.625, 1),
                 request(2, 1.0, 1.5, 3.5, 5), request(3, 2.0, 2.125, 4.0, 16),
                 request(4, 0.5, None, None, 8, status="rejected"),
                 request(5, 3.0, None, None, 8, status="unfinished"))


def figures(slo: SloSpec) -> dict:
    # no ITL here (no step table): the request-level figures only
    return serving_metrics(pd.DataFrame({"time_s": [], "duration_s": []}), hand_table(), slo)


def test_vllm_named_figures_on_a_hand_built_table():
    out = figures(SloSpec(percentiles=(50, 99.9)))
    assert out["completed"] == 4 and out["duration_s"] == 4.0
    assert out["request_throughput"] == 1.0
    assert out["output_throughput"] == (11 + 1 + 5 + 16) / 4.0
    assert out["mean_ttft_ms"] == (250 + 625 + 500 + 125) / 4
    assert out["median_ttft_ms"] == 375.0  # between 250 and 500
    assert out["p50_ttft_ms"] == out["median_ttft_ms"]
    assert "p99.9_ttft_ms" in out and "p99_ttft_ms" not in out
    assert out["mean_tpot_ms"] == pytest.approx((125 + 500 + 125) / 3)  # one-token output left out
    assert out["mean_e2el_ms"] == (1500 + 625 + 2500 + 2000) / 4
    assert out["mean_itl_ms"] is None  # no steps: no token times
    assert out["request_goodput"] is None and out["slo_attainment"] is None  # no SLO set


@pytest.mark.parametrize("slo, good", [
    (SloSpec(ttft_ms=500), 3),                    # 0.25, 0.5, 0.125 <= 0.5 s; 0.625 misses
    (SloSpec(ttft_ms=500, tpot_ms=125), 2),       # and TPOT <= 0.125 s: request 2 misses
    (SloSpec(tpot_ms=125), 3),                    # the one-token output meets any TPOT
    (SloSpec(e2el_ms=2000), 3),                   # 2.5 s misses; 2.0 s is within
    (SloSpec(ttft_ms=125, tpot_ms=125, e2el_ms=2000), 1),  # request 3 only
])
def test_goodput_counts_finished_requests_within_every_target(slo, good):
    out = figures(slo)
    assert out["good_completed"] == good
    assert out["request_goodput"] == pytest.approx(good / 4.0)   # per second of the run
    assert out["slo_attainment"] == round(good / 6.0, 6)   # of all six requests


def test_itl_mean_per_request_is_its_tpot():
    reqs = table(request(0, 0.0, 0.5, 4.5, 4))
    out = serving_metrics(STEPS, reqs, SloSpec())
    assert out["mean_itl_ms"] == pytest.approx(out["mean_tpot_ms"]) == pytest.approx(4000 / 3)
    assert out["p50_itl_ms"] == pytest.approx(1000.0)


@pytest.mark.parametrize("node, key", [
    ({"ttft_ms": -1}, "slo.ttft_ms"), ({"tpot_ms": "fast"}, "slo.tpot_ms"),
    ({"e2el_ms": float("nan")}, "slo.e2el_ms"), ({"percentiles": [50, 101]}, "slo.percentiles"),
    ({"percentiles": []}, "slo.percentiles"), ({"ttft": 5}, "slo.ttft"),
])
def test_bad_slo_values_are_one_line_errors_naming_the_key(node, key):
    with pytest.raises(ConfigError) as err:
        build_spec(SloSpec, node, "slo")
    assert str(err.value).startswith(f"{key}:") and "\n" not in str(err.value)


def test_slo_targets_are_the_ones_set():
    spec = build_spec(SloSpec, {"ttft_ms": 500, "tpot_ms": None, "percentiles": [90]}, "slo")
    assert spec.targets_ms == {"ttft": 500} and spec.percentiles == (90,)
    assert np.isclose(SloSpec().percentiles, (50, 90, 99)).all()


# --- ITL from the engine's token breaks against every token's time, observed -----------

from engine_helpers import engine_spec, make_requests, paged  # noqa: E402
from engine_helpers import run as run_engine_on  # noqa: E402


def observed_gaps(requests, system, spec) -> tuple[np.ndarray, np.ndarray]:
    """(ITL from the run's tables and token breaks, ITL from each token's time as a spy on
    ``Scheduler.postprocess`` sees it), both in request order."""
    from harness.engine import scheduler as scheduler_module

    times: dict[int, list[float]] = {}
    original = scheduler_module.Scheduler.postprocess

    def spy(self, plan, now, sampled=None):
        before = {g: g.seqs[0].num_generated for g in self.running if len(g.seqs) == 1}
        finished = original(self, plan, now, sampled)
        for group, count in before.items():
            if group.seqs[0].num_generated > count:
                times.setdefault(group.request.request_id, []).append(now)
        return finished

    scheduler_module.Scheduler.postprocess = spy
    try:
        result = run_engine_on(requests, system, spec)
    finally:
        scheduler_module.Scheduler.postprocess = original
    steps, reqs = result.recorder.step_table(), result.recorder.request_table()
    derived = inter_token_latencies(steps, reqs, result.recorder.token_breaks)
    truth = np.concatenate([np.diff(times[int(i)]) for i in reqs["request_id"]
                            if int(i) in times])
    return derived, truth, result


@pytest.mark.parametrize("overrides", [
    dict(kv_capacity_slots=512),                                     # recompute preemptions
    dict(kv_capacity_slots=512, preemption="swap"),                  # swaps
    dict(chunked_prefill=True, max_num_batched_tokens=40, max_num_seqs=64),  # budget waits
])
def test_itl_from_token_breaks_is_every_tokens_gap_exactly(overrides):
    requests = make_requests([(60 + 7 * i, 20 + 3 * i) for i in range(12)], gap=0.002)
    spec = engine_spec(fast_forward=False, **overrides)
    derived, truth, result = observed_gaps(requests, paged(16), spec)
    assert result.recorder.token_breaks  # the case has breaks (else it tests nothing)
    assert len(derived) == sum(r.output_len - 1 for r in requests)
    assert np.array_equal(np.sort(derived), np.sort(truth))  # (order: see the docstring)
    # fast-forwarded decode spans (no break inside one) give the same gaps
    fast = run_engine_on(requests, paged(16), engine_spec(fast_forward=True, **overrides))
    fast_gaps = inter_token_latencies(fast.recorder.step_table(), fast.recorder.request_table(),
                                      fast.recorder.token_breaks)
    assert np.array_equal(np.sort(fast_gaps), np.sort(truth))


@pytest.mark.parametrize("overrides", [
    dict(kv_capacity_slots=512),                                     # recompute preemptions
    dict(chunked_prefill=True, max_num_batched_tokens=40, max_num_seqs=64),  # budget waits
])
def test_the_summary_counts_step_gaps_as_the_token_gaps_they_stand_for(overrides):
    """serving_metrics counts each step gap once per request spanning it (it never writes out
    the millions of token gaps of a long trace): the multiset equals inter_token_latencies'
    and the figures equal those of the written-out array, fractional percentiles too."""
    from harness.metrics.latency import _stats_ms, inter_token_gap_counts

    requests = make_requests([(60 + 7 * i, 20 + 3 * i) for i in range(12)], gap=0.002)
    result = run_engine_on(requests, paged(16), engine_spec(**overrides))
    steps, reqs = result.recorder.step_table(), result.recorder.request_table()
    breaks = result.recorder.token_breaks
    gaps, counts = inter_token_gap_counts(steps, reqs, breaks)
    written = inter_token_latencies(steps, reqs, breaks)
    assert breaks and counts.max() > 1  # both kinds of request are in the case
    assert np.array_equal(np.sort(np.repeat(gaps, counts)), np.sort(written))
    for percentiles in ([50, 90, 99], [1, 37.5, 99.9, 100]):
        assert _stats_ms("itl", gaps, percentiles, counts) == _stats_ms("itl", written, percentiles)


@pytest.mark.parametrize("overrides", [
    dict(kv_capacity_slots=512),                                     # recompute preemptions
    dict(kv_capacity_slots=512, preemption="swap"),                  # swaps
    dict(chunked_prefill=True, max_num_batched_tokens=40, max_num_seqs=64,
         kv_capacity_slots=512),                                     # budget waits, preemptions
])
def test_broken_requests_gaps_in_one_pass_are_token_steps_request_by_request(overrides):
    """broken_token_gaps (every broken request at once) gives, value for value and in
    order, what np.diff of each request's token_steps gives."""
    from harness.metrics.latency import _step_of, broken_token_gaps, token_steps

    requests = make_requests([(60 + 7 * i, 20 + 3 * i) for i in range(12)], gap=0.002)
    result = run_engine_on(requests, paged(16), engine_spec(fast_forward=False, **overrides))
    steps, reqs = result.recorder.step_table(), result.recorder.request_table()
    breaks = result.recorder.token_breaks
    ends = steps["time_s"].to_numpy() + steps["duration_s"].to_numpy()
    done = reqs[reqs["request_id"].isin(list(breaks))]
    assert len(done) > 1  # several broken requests (else the one pass tests little)
    first_s, finish_s = done["first_token_s"].to_numpy(), done["finish_s"].to_numpy()
    lengths = done["output_len"].to_numpy()
    ids = done["request_id"].tolist()
    one_by_one = np.concatenate([
        np.diff(ends[token_steps(ends, first_s[i], finish_s[i], int(lengths[i]), breaks[rid])])
        for i, rid in enumerate(ids)])
    at_once = broken_token_gaps(ends, _step_of(ends, first_s), finish_s, lengths,
                                [breaks[rid] for rid in ids])
    assert at_once.tolist() == one_by_one.tolist()


def test_broken_requests_gaps_with_a_one_token_request_and_a_break_at_the_end():
    # STEPS ends at 0.5, 1.5, 2.5, 4.5, 5.0, 6.0; request A: 1 token at step 0 (no gap);
    # B: tokens at steps 0, 1, then a break that produced both (a last stretch of none);
    # C: tokens at steps 1, 2, broken at step 3, then steps 4, 5
    from harness.metrics.latency import broken_token_gaps

    ends = (STEPS["time_s"] + STEPS["duration_s"]).to_numpy()
    gaps = broken_token_gaps(ends, np.array([0, 0, 1]), np.array([0.5, 1.5, 6.0]),
                             np.array([1, 2, 4]), [[(0.5, 1)], [(1.5, 2)], [(2.5, 2)]])
    assert gaps.tolist() == [1.0, 1.0, 2.5, 1.0]
    with pytest.raises(RuntimeError):  # the first token is not at step 1
        broken_token_gaps(ends, np.array([1]), np.array([1.5]), np.array([2]), [[(1.5, 2)]])


def test_the_summary_sorts_gaps_as_numpy_stable_argsort_does():
    from harness.metrics.latency import _stable_argsort

    rng = np.random.default_rng(0)
    for values in (rng.integers(0, 50, 10_000) / 8.0,   # many ties
                   rng.random(1_000), np.array([0.0, -0.0, 0.0, 1.0, -0.0]), np.zeros(1),
                   np.zeros(0)):
        assert _stable_argsort(values).tolist() == np.argsort(values, kind="stable").tolist()
