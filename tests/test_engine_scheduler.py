"""Scheduler and engine behaviour on small, hand-checked workloads."""

from __future__ import annotations

import numpy as np
import pytest

from engine_helpers import contiguous, engine_spec, make_requests, paged, run
from harness.metrics.summaries import memory_summary, serving_summary


def _finished(run_result):
    table = run_result.recorder.request_table()
    return table[table["status"] == "finished"]


def test_every_request_finishes_with_exact_kv_length():
    requests = make_requests([(10, 5), (33, 1), (16, 17)])
    result = run(requests, paged(block_size=16))
    assert len(_finished(result)) == 3
    assert result.scheduler.manager.breakdown(False).token_states == 0  # all freed


def test_max_num_seqs_caps_the_batch():
    requests = make_requests([(8, 20)] * 10)
    result = run(requests, paged(), engine_spec(max_num_seqs=3))
    steps = result.recorder.step_table()
    assert steps["num_seqs"].max() == 3
    assert len(_finished(result)) == 10


def test_static_batching_admits_only_when_the_batch_has_drained():
    requests = make_requests([(8, 2), (8, 30), (8, 2)], gap=0.0)
    spec = engine_spec(max_num_seqs=2, scheduling="static")
    table = run(requests, paged(), spec).recorder.request_table().set_index("request_id")
    # request 2 waits for the slow request 1 to finish, not just for request 0
    assert table.loc[2, "first_token_s"] >= table.loc[1, "finish_s"]
    continuous = run(requests, paged(), engine_spec(max_num_seqs=2)).recorder.request_table()
    assert continuous.set_index("request_id").loc[2, "first_token_s"] < table.loc[1, "finish_s"]


def test_preemption_hits_the_latest_arrival_first_and_everything_finishes():
    # 4 blocks of 16: two sequences growing to 40 tokens cannot both fit
    requests = make_requests([(16, 25), (16, 25)])
    result = run(requests, paged(block_size=16), engine_spec(kv_capacity_slots=64))
    table = result.recorder.request_table().set_index("request_id")
    assert result.scheduler.num_preemptions >= 1
    assert table.loc[0, "preemptions"] == 0 and table.loc[1, "preemptions"] >= 1
    assert (table["status"] == "finished").all()


def test_swap_preemption_round_trips():
    requests = make_requests([(16, 25), (16, 25)])
    spec = engine_spec(kv_capacity_slots=64, preemption="swap")
    result = run(requests, paged(block_size=16), spec)
    assert result.scheduler.num_swaps == result.scheduler.num_preemptions >= 1
    assert result.scheduler.swap_fallbacks == {"multi_sequence_group": 0, "cpu_swap_space_full": 0}
    assert (result.recorder.request_table()["status"] == "finished").all()


def test_swap_preemption_recomputes_and_counts_what_it_cannot_swap():
    """No CPU swap space, or a group of several sequences: the preemption recomputes, and the
    scheduler counts why (results.json's ``recomputed_instead_of_swap``)."""
    no_space = run(make_requests([(16, 25), (16, 25)]), paged(block_size=16),
                   engine_spec(kv_capacity_slots=64, preemption="swap", swap_space_gib=0))
    scheduler = no_space.scheduler
    assert scheduler.num_swaps == 0 and scheduler.num_preemptions >= 1
    assert scheduler.swap_fallbacks == {"multi_sequence_group": 0,
                                        "cpu_swap_space_full": scheduler.num_preemptions}
    groups = run(make_requests([(16, 25), (16, 25)], num_samples=2), paged(block_size=16),
                 engine_spec(kv_capacity_slots=128, preemption="swap"))
    scheduler = groups.scheduler
    assert scheduler.num_swaps == 0 and scheduler.num_preemptions >= 1
    assert scheduler.swap_fallbacks == {"multi_sequence_group": scheduler.num_preemptions,
                                        "cpu_swap_space_full": 0}
    assert (groups.recorder.request_table()["status"] == "finished").all()


def test_a_manager_that_never_swaps_recomputes_and_says_why():
    """Radix declares no swapping (``Capabilities.swaps``): under preemption=swap every
    preemption recomputes, counted as the manager's doing, not as a full CPU swap space
    (there is plenty of it here)."""
    from harness.config.specs import SystemSpec
    from harness.run.serve import swap_fallback_warnings

    radix = SystemSpec(name="radix", kind="radix", block_size=16, prefix_caching=True,
                       options={"page_size": 16})
    result = run(make_requests([(16, 25), (16, 25)]), radix,
                 engine_spec(kv_capacity_slots=64, preemption="swap", swap_space_gib=1.0))
    scheduler = result.scheduler
    assert scheduler.num_swaps == 0 and scheduler.num_preemptions >= 1
    assert scheduler.swap_fallbacks == {"multi_sequence_group": 0, "cpu_swap_space_full": 0,
                                        "manager_does_not_swap": scheduler.num_preemptions}
    assert (result.recorder.request_table()["status"] == "finished").all()
    [line] = swap_fallback_warnings({"radix": {"preemptions": scheduler.num_preemptions,
                                               "recomputed_instead_of_swap": scheduler.swap_fallbacks}})
    assert "because its manager never swaps" in line and "swap_space_gib" not in line


def test_request_larger_than_the_pool_is_rejected_and_counted():
    requests = make_requests([(8, 4), (2000, 10), (8, 4)])
    result = run(requests, paged(), engine_spec(kv_capacity_slots=256))
    table = result.recorder.request_table()
    assert list(table["status"]) == ["finished", "rejected", "finished"]
    assert result.rejected == {"larger_than_pool": 1}


def test_chunked_prefill_splits_long_prompts_by_the_token_budget():
    requests = make_requests([(100, 3)])
    spec = engine_spec(chunked_prefill=True, max_num_batched_tokens=32)
    steps = run(requests, paged(), spec).recorder.step_table()
    assert list(steps["num_batched_tokens"][:4]) == [32, 32, 32, 4]


def test_prefix_caching_serves_shared_prefix_blocks():
    prefix = np.arange(64, dtype=np.int32)
    requests = make_requests([(80, 4)] * 3, gap=1.0, prefix=prefix)
    result = run(requests, paged(block_size=16, prefix_caching=True))
    assert result.scheduler.prompt_tokens_cached == 2 * 64
    assert list(result.recorder.request_table()["cached_tokens"]) == [0, 64, 64]


def test_parallel_sampling_shares_prompt_blocks_only_in_paged():
    requests = make_requests([(64, 20)], num_samples=4)
    paged_run = run(requests, paged(block_size=16))
    oracle_run = run(requests, contiguous("oracle"))
    paged_mem = memory_summary(paged_run.recorder.step_table(), 1024)
    oracle_mem = memory_summary(oracle_run.recorder.step_table(), 1024)
    assert paged_mem["sharing_savings_pct"] > 40
    assert oracle_mem["sharing_savings_pct"] == 0
    for result in (paged_run, oracle_run):
        table = _finished(result)
        assert list(table["num_seqs"]) == [4]


def test_beam_search_forks_and_finishes():
    requests = make_requests([(40, 12)] * 2, beam_width=4)
    for system in (paged(block_size=8), contiguous("oracle")):
        result = run(requests, system)
        assert len(_finished(result)) == 2
        assert result.scheduler.manager.breakdown(False).token_states == 0


def test_runs_are_deterministic():
    requests = make_requests([(int(p), int(o)) for p, o in
                              np.random.default_rng(3).integers(1, 200, size=(40, 2))], gap=0.01)
    first, second = run(requests, paged()), run(requests, paged())
    assert first.output_digest == second.output_digest
    assert first.recorder.step_table().equals(second.recorder.step_table())


@pytest.mark.parametrize("system", [paged(), contiguous("max"), contiguous("pow2"),
                                    contiguous("oracle")], ids=lambda s: s.name)
def test_breakdown_sums_to_capacity_every_step(system):
    requests = make_requests([(int(p), int(o)) for p, o in
                              np.random.default_rng(1).integers(1, 300, size=(30, 2))], gap=0.005)
    steps = run(requests, system, max_model_len=1024).recorder.step_table()
    columns = ["token_states", "reserved", "internal_over_reservation", "internal_rounding",
               "external_fragmentation", "idle"]
    capacity = 1024
    assert (steps[columns].sum(axis=1) == capacity).all()
    summary = memory_summary(steps, capacity)
    total = sum(summary[k] for k in ("token_states_pct", "reserved_pct", "internal_fragmentation_pct",
                                     "external_fragmentation_pct", "idle_pct"))
    assert total == pytest.approx(100.0, abs=1e-3)


def test_latency_metrics_are_consistent():
    requests = make_requests([(32, 10), (32, 1)], gap=0.5)
    result = run(requests, paged())
    serving = serving_summary(result.recorder.step_table(), result.recorder.request_table())
    assert serving["requests"]["finished"] == 2
    assert 0 < serving["latency"]["ttft_s"]["p50"] <= serving["latency"]["e2e_s"]["p50"]


@pytest.mark.parametrize("system", [paged(block_size=4, prefix_caching=True), contiguous("max")],
                         ids=["paged", "max"])
def test_plan_totals_equal_the_sums_over_its_chunks(system, monkeypatch):
    """The cost model reads the plan's running totals; preemptions take chunks back out."""
    from harness.engine.scheduler import Scheduler

    plans = []
    schedule = Scheduler.schedule
    monkeypatch.setattr(Scheduler, "schedule", lambda self: plans.append(schedule(self)) or plans[-1])
    requests = make_requests([(12, 30), (40, 9), (7, 25), (30, 12), (5, 40)] * 3, gap=0.002)
    spec = engine_spec(kv_capacity_slots=160, max_num_batched_tokens=48, fast_forward=False)
    run(requests, system, spec)
    assert any(plan.num_preempted for plan in plans) == (system.kind == "paged")  # max reserves up front
    for plan in plans:
        chunks = plan.chunks
        assert plan.num_batched_tokens == sum(c.num_tokens for c in chunks)
        assert plan.num_seqs == sum(1 + len(c.members) for c in chunks)
        assert plan.kv_read_slots == sum(c.start for c in chunks)
        assert plan.attention_pairs == sum(c.num_tokens * c.start + c.num_tokens * (c.num_tokens + 1) // 2
                                           for c in chunks)
        assert plan.num_prefill_chunks == sum(c.num_tokens > 1 for c in chunks)


def _mixed_requests():
    """Single sequences, parallel samples and beams, arriving close together."""
    from harness.workloads.request import Request

    rng = np.random.default_rng(11)
    requests = []
    for i, (prompt_len, output_len) in enumerate(rng.integers(2, 60, size=(30, 2)).tolist()):
        ids = rng.integers(0, 1 << 29, prompt_len, dtype=np.int32)
        ids.flags.writeable = False
        requests.append(Request(i, i * 0.002, ids, output_len, num_samples=2 if i % 7 == 3 else 1,
                                beam_width=2 if i % 11 == 5 else 1))
    return tuple(requests)


@pytest.mark.parametrize("system", [paged(block_size=4, prefix_caching=True), contiguous("max")],
                         ids=["paged", "max"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_compact_decodes_run_as_chunk_by_chunk_scheduling(system, preemption, monkeypatch):
    """The batched one-token decodes (kept compact in the plan, sampled by a specialised
    loop) give every step row, request row and token of scheduling each group alone."""
    from harness.engine.scheduler import Scheduler

    spec = engine_spec(kv_capacity_slots=256, max_num_batched_tokens=120, chunked_prefill=True,
                       preemption=preemption, fast_forward=False)
    requests = _mixed_requests()
    plans = []
    schedule = Scheduler.schedule
    monkeypatch.setattr(Scheduler, "schedule", lambda self: plans.append(schedule(self)) or plans[-1])
    compact = run(requests, system, spec, max_model_len=128)
    assert compact.complete and not compact.rejected
    assert any(plan.decode_seqs and plan.other_chunks for plan in plans)  # interleaved
    assert any(plan.num_preempted for plan in plans) == (system.kind == "paged")
    monkeypatch.setattr(Scheduler, "_decode_run", lambda self, index, plan, batch_decode: index)
    alone = run(requests, system, spec, max_model_len=128)
    assert compact.output_digest == alone.output_digest
    assert compact.recorder.requests == alone.recorder.requests
    assert compact.recorder.steps == alone.recorder.steps


def test_step_plan_lists_compact_decodes_and_other_chunks_in_scheduling_order():
    from harness.engine.plan import ScheduledChunk, StepPlan
    from harness.engine.sequence import Sequence, SequenceGroup

    requests = make_requests([(8, 4)] * 5)
    a, b, c, d, e = (Sequence(i, SequenceGroup(r), 0) for i, r in enumerate(requests))
    for seq in (a, b, d):
        seq.num_computed = 7  # its last prompt token's KV computes now
    plan = StepPlan()
    assert plan.is_empty
    plan.add_decodes([a, b], [7, 7])
    plan.add_chunk(ScheduledChunk(c, 0, 5))
    plan.add_chunk(ScheduledChunk(e, 0, 3))
    plan.add_decodes([d], [7])
    assert [(x.seq, x.start, x.end) for x in plan.chunks] == [
        (a, 7, 8), (b, 7, 8), (c, 0, 5), (e, 0, 3), (d, 7, 8)]
    assert (plan.num_batched_tokens, plan.num_prefill_tokens, plan.num_seqs) == (11, 8, 5)
    assert (plan.kv_read_slots, plan.attention_pairs, plan.num_prefill_chunks) == (21, 45, 2)
    assert plan.remove_chunks({c.seq_id}) == 5
    assert [x.seq for x in plan.chunks] == [a, b, e, d]
    assert (plan.num_batched_tokens, plan.num_prefill_tokens, plan.num_seqs) == (6, 3, 4)
    assert (plan.kv_read_slots, plan.attention_pairs, plan.num_prefill_chunks) == (21, 30, 1)
    assert not plan.is_empty


def test_a_step_row_holds_the_memory_the_step_ran_with():
    """Two 16-slot max reservations fill a 32-slot pool and the third request waits. The
    step in which the two finish still ran with both reservations: its row holds their
    KV, not the frees that follow it (which would read as 32 slots of external
    fragmentation while the waiting request is about to be admitted)."""
    result = run(make_requests([(5, 6)] * 3), contiguous("max"), engine_spec(kv_capacity_slots=32),
                 max_model_len=16)
    steps = result.recorder.step_table()
    assert steps["num_seqs"].tolist() == [2] * 6 + [1] * 6
    assert steps["token_states"].tolist() == [10, 12, 14, 16, 18, 20, 5, 6, 7, 8, 9, 10]
    assert steps["reserved"].tolist() == [10, 8, 6, 4, 2, 0, 5, 4, 3, 2, 1, 0]
    assert steps["internal_over_reservation"].tolist() == [12] * 6 + [6] * 6
    assert steps["allocated_slots"].tolist() == [32] * 6 + [16] * 6
    assert steps["external_fragmentation"].tolist() == [0] * 12
    assert steps["idle"].tolist() == [0] * 6 + [16] * 6


def test_the_last_prompt_token_alone_is_prefill():
    """A one-token prompt, and the last token of a prompt chunked 8 + 1, are prompt tokens:
    prefill, whether the scheduler batches the token with the decodes or as a chunk."""
    spec = engine_spec(max_num_batched_tokens=8, chunked_prefill=True)
    steps = run(make_requests([(9, 3)]), paged(block_size=4), spec).recorder.step_table()
    assert steps["num_prefill_tokens"].tolist() == [8, 1, 0, 0]
    steps = run(make_requests([(1, 3), (9, 2)]), paged(block_size=4), spec).recorder.step_table()
    assert steps["num_batched_tokens"].tolist() == [8, 3, 2]
    assert steps["num_prefill_tokens"].tolist() == [8, 2, 0]


def test_a_run_without_steps_has_every_memory_key_unmeasured():
    steps = run(make_requests([(10, 5)]), paged()).recorder.step_table()
    full = memory_summary(steps, 1024)
    empty = memory_summary(steps.iloc[:0], 1024)
    assert set(empty) == set(full)
    assert {k for k, v in empty.items() if v is not None} == {"capacity_slots"}


def test_a_swap_run_warns_of_the_preemptions_it_recomputed():
    from harness.run.serve import swap_fallback_warnings

    none = {"multi_sequence_group": 0, "cpu_swap_space_full": 0}
    systems = {"paged": {"preemptions": 9, "recomputed_instead_of_swap": {
                   "multi_sequence_group": 5, "cpu_swap_space_full": 2}},
               "oracle": {"preemptions": 4, "recomputed_instead_of_swap": none},
               "max": {"preemptions": 3}}  # a recompute run: no such key
    assert swap_fallback_warnings(systems) == [
        "engine.preemption=swap: paged recomputed 7 of its 9 preemptions instead (5 of "
        "parallel-sampling or beam-search groups, which are never swapped; 2 with the CPU swap "
        "space full: raise engine.swap_space_gib)"]
