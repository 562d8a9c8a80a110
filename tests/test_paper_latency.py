"""Shortened Fig. 12 and Fig. 18b studies: structure and the direction of every effect.

Fig. 12: paged sustains a higher request rate than every contiguous baseline on both
traces, and Orca (Max) the lowest. Fig. 18b: once memory is the limit, blocks larger
than the sequences (256 tokens on Alpaca-like) cost latency.
"""

from __future__ import annotations

import pytest

from harness.studies.paper import sustained_rate
from paper_helpers import run_short_study

CONTIGUOUS = ("orca_max", "orca_pow2", "orca_oracle")


@pytest.fixture(scope="module")
def fig12(tmp_path_factory):
    # 1/10 of the arrival windows (60 s ShareGPT-like, 12 s Alpaca-like) on a coarse grid.
    # Queues grow for 1/10 of the time past capacity, so the threshold is lowered in step
    # (0.05 s/token, about twice the unloaded latency), and sweeps stop at the crossing.
    return run_short_study("vllm_fig12", tmp_path_factory.mktemp("fig12"), [
        "study.scale=0.1", "study.rates.sharegpt=[0.5,1,2,4,8]", "study.rates.alpaca=[4,16,64,128]",
        "study.threshold_s_per_token=0.05", "study.points_after_saturation=0"])


@pytest.fixture(scope="module")
def fig18b(tmp_path_factory):
    return run_short_study("vllm_fig18b", tmp_path_factory.mktemp("fig18b"), [
        "study.scale=0.1", "study.block_sizes=[16,256]"])


def test_sustained_rate_interpolates_the_threshold_crossing():
    points = [(1.0, 0.1), (2.0, 0.1), (3.0, 0.3)]
    assert sustained_rate(points, 0.2) == {"rate": 2.5, "bounded": True, "lo": 2.0, "hi": 3.0}
    assert sustained_rate([(1.0, 0.1), (2.0, 0.15)], 0.2)["bounded"] is False
    assert sustained_rate([(1.0, 0.5)], 0.2)["rate"] is None
    assert sustained_rate([(1.0, 0.1), (2.0, None)], 0.2)["rate"] == 1.0  # unfinished = past capacity


def test_fig12_series_cover_every_system_and_stop_after_saturation(fig12):
    for panel in ("sharegpt", "alpaca"):
        for system in (*CONTIGUOUS, "vllm"):
            points = fig12["series"][panel][system]
            assert points, (panel, system)
            above = [lat for _, lat in points if lat is None or lat > fig12["threshold_s_per_token"]]
            assert len(above) == 1  # the sweep stopped at the crossing
            assert fig12["sustained"][panel][system]["bounded"], (panel, system)


def test_fig12_paged_sustains_the_highest_rate_and_max_the_lowest(fig12):
    m = fig12["measured"]
    for panel in ("sharegpt", "alpaca"):
        vllm = m[f"{panel}.vllm.sustained_rps"]
        for system in CONTIGUOUS:
            assert vllm > m[f"{panel}.{system}.sustained_rps"], (panel, system)
        assert m[f"{panel}.orca_max.sustained_rps"] <= min(
            m[f"{panel}.orca_pow2.sustained_rps"], m[f"{panel}.orca_oracle.sustained_rps"])
        assert m[f"{panel}.vllm_over_max"] > m[f"{panel}.vllm_over_oracle"] > 1.0


def test_fig18b_sweeps_block_sizes_at_fixed_rates_and_saturated(fig18b):
    series = fig18b["series"]
    assert set(series) == {"sharegpt", "alpaca", "sharegpt.saturated", "alpaca.saturated"}
    for points in series.values():
        assert [bs for bs, _ in points] == [16, 256]
        assert all(lat is not None and lat > 0 for _, lat in points)
    assert 16 in fig18b["measured"]["sharegpt.best_block_sizes"]


def test_fig18b_blocks_longer_than_the_sequences_cost_latency_when_memory_binds(fig18b):
    m = fig18b["measured"]
    assert m["alpaca.saturated.block_256"] > 1.2 * m["alpaca.saturated.block_16"]
    assert m["alpaca.saturated.best_block_sizes"] == [16]
    detail = fig18b["details"]
    assert (detail["alpaca.saturated.block_256"]["internal_fragmentation_pct"]
            > detail["alpaca.saturated.block_16"]["internal_fragmentation_pct"])
