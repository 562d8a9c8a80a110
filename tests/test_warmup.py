"""The torch executor's start-up warm-up and the slow-step check of its timed steps."""

from __future__ import annotations

import numpy as np

from harness.engine.warmup import index_widths, token_counts
from harness.metrics.slow_steps import slow_steps, step_shape
from torch_helpers import TINY, engine, mixed_workload, one_torch_thread, paged, run_torch  # noqa: F401


def test_token_counts_and_table_widths_cover_every_specialisation():
    assert token_counts(512) == [1, 4, 16, 64, 256, 512]
    assert token_counts(1) == [1]
    assert index_widths(100) == [1, 16, 17]  # stride 1, a multiple of 16, another
    assert index_widths(10) == [1, 10]


def test_slow_steps_flags_a_step_over_twice_its_shapes_median():
    shapes = [("decode", 8)] * 5 + [("prefill", 4096)] * 3
    durations = [0.010, 0.011, 0.030, 0.010, 0.012, 0.50, 0.45, 0.47]
    got = slow_steps(durations, shapes)
    assert [(g["step"], g["phase"], g["ratio"]) for g in got] == [(2, "decode", 2.86)]
    assert got[0]["peers_median_s"] == 0.0105
    # a shape with two steps has too few peers to judge
    assert slow_steps([0.1, 1.0], [("decode", 1)] * 2) == []
    assert step_shape(7586, 10, 7581) == ("prefill", 4096) and step_shape(99, 99, 0) == ("decode", 64)


def test_the_executor_warms_up_before_the_run_and_reports_slow_steps(capsys):
    result = run_torch(mixed_workload(n=6), paged(16), engine(batch_invariant=False))
    printed = capsys.readouterr().err
    assert "paged: warm-up" in printed and "attention kernels at table widths [1, 16, 17]" in printed
    executor = result.executor
    report = executor.report()
    assert report["warmup"]["token_counts"] == token_counts(512)
    assert report["warmup"]["seconds"] >= report["warmup"]["linear_s"] > 0
    # plant a slow step: the decode step of the largest decode shape taken 10x its peers
    decode = [i for i, s in enumerate(executor.step_log) if s.num_prefill_chunks == 0]
    by_shape = {}
    for i in decode:
        by_shape.setdefault(step_shape(executor.step_log[i].num_tokens, executor.step_log[i].num_seqs, 0), []).append(i)
    steps = max(by_shape.values(), key=len)
    assert len(steps) >= 3
    median = float(np.median([executor.step_log[i].duration_s for i in steps[1:]]))
    executor.step_log[steps[0]] = executor.step_log[steps[0]]._replace(duration_s=10 * median + 1e-3)
    flagged = executor.report()["slow_steps"]
    assert flagged["count"] >= 1 and steps[0] in [f["step"] for f in flagged["steps"]]
    assert "timed steps took more than 2x the median of their shape" in capsys.readouterr().err
