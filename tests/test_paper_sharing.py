"""Shortened Fig. 15 and shared-prefix studies: structure and the direction of every effect.

Fig. 15: beam search saves more memory than parallel sampling at the same width, and
more sequences save more. Shared prefix: paged with prefix caching sustains a higher
rate than Orca (Oracle), and its advantage grows with the shared prefix's length.
"""

from __future__ import annotations

import pytest

from paper_helpers import run_short_study


@pytest.fixture(scope="module")
def fig15(tmp_path_factory):
    return run_short_study("vllm_fig15", tmp_path_factory.mktemp("fig15"), ["study.scale=0.1"])


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    # 6-second windows: threshold lowered in step (see test_paper_latency.fig12)
    rates = "[8,16,32,64,128,256]"
    return run_short_study("shared_prefix", tmp_path_factory.mktemp("prefix"), [
        "study.scale=0.1", f"study.rates.one_shot={rates}", f"study.rates.five_shot={rates}",
        "study.threshold_s_per_token=0.05", "study.points_after_saturation=0"])


def test_fig15_measures_block_savings_for_every_width(fig15):
    m = fig15["measured"]
    for panel in ("parallel", "beam"):
        for width in (2, 4, 6):
            saving = m[f"{panel}.{width}"]
            assert saving is not None and 0.0 < saving < 100.0, (panel, width)
            detail = fig15["details"][f"{panel}.{width}"]
            assert 0.0 < detail["token_sharing_savings_pct"] < 100.0


def test_fig15_beam_search_saves_more_than_parallel_sampling(fig15):
    m = fig15["measured"]
    for width in (2, 4, 6):
        assert m[f"beam.{width}"] > m[f"parallel.{width}"] + 10.0, width


def test_fig15_more_sequences_save_more(fig15):
    m = fig15["measured"]
    for panel in ("parallel", "beam"):
        assert m[f"{panel}.2"] < m[f"{panel}.4"] < m[f"{panel}.6"], panel


def test_shared_prefix_paged_sustains_more_and_more_so_with_a_longer_prefix(prefix):
    m = prefix["measured"]
    for panel in ("one_shot", "five_shot"):
        assert m[f"{panel}.vllm_over_oracle"] is not None
        assert m[f"{panel}.vllm_over_oracle"] > 1.0, panel
        assert prefix["sustained"][panel]["orca_oracle"]["bounded"], panel
    assert m["five_shot.vllm_over_oracle"] > m["one_shot.vllm_over_oracle"]


def test_shared_prefix_hits_the_prefix_cache(prefix):
    hits = prefix["prefix_hit_rate"]
    assert hits and all(rate > 0.3 for rate in hits.values())
