"""Shortened Fig. 2 and Fig. 13 studies: structure and the direction of every effect.

Fig. 2: paged keeps the largest share of KV memory in token states; among the
contiguous baselines the share grows Max < Pow2 < Oracle; Max loses the most to
over-reservation, Oracle none. Fig. 13: paged batches at least as many requests as
every contiguous baseline, strictly more once memory is the limit (saturated).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from paper_helpers import run_short_study

CONTIGUOUS = ("orca_max", "orca_pow2", "orca_oracle")
CATEGORIES = ("token_states", "reservation", "internal_fragmentation", "external_and_others")


@pytest.fixture(scope="module")
def fig2(tmp_path_factory):
    return run_short_study("vllm_fig2", tmp_path_factory.mktemp("fig2"), ["study.scale=0.1"])


@pytest.fixture(scope="module")
def fig13(tmp_path_factory):
    # 1/10 of the windows: 120 ShareGPT-like requests at 2 req/s, 360 Alpaca-like at 30 req/s
    return run_short_study("vllm_fig13", tmp_path_factory.mktemp("fig13"), ["study.scale=0.1"])


def test_fig2_breakdown_covers_the_pool_for_every_system(fig2):
    measured = fig2["measured"]
    assert {job["params"]["paper_system"] for job in fig2["jobs"]} == {*CONTIGUOUS, "vllm"}
    for system in (*CONTIGUOUS, "vllm"):
        total = sum(measured[f"{system}.{c}"] for c in CATEGORIES)
        assert total == pytest.approx(100.0, abs=0.01), system
        assert measured[f"{system}.waste"] == pytest.approx(100.0 - measured[f"{system}.token_states"])
    assert fig2["complete"]


def test_fig2_paged_keeps_the_most_token_states_and_the_order_of_the_baselines(fig2):
    m = fig2["measured"]
    for system in CONTIGUOUS:
        assert m["vllm.token_states"] > m[f"{system}.token_states"] + 20.0, system
    assert m["orca_max.token_states"] < m["orca_pow2.token_states"] < m["orca_oracle.token_states"]


def test_fig2_over_reservation_is_largest_for_max_and_absent_for_oracle(fig2):
    m = fig2["measured"]
    assert m["orca_max.internal_fragmentation"] > m["orca_pow2.internal_fragmentation"] > 0.0
    assert m["orca_oracle.internal_fragmentation"] == pytest.approx(0.0, abs=1e-9)
    # paging wastes only the tail of each last block
    assert m["vllm.internal_fragmentation"] < 3.0


def test_fig2_rate_saturates_every_system(fig2):
    # 200 requests: the drain after the last arrival is a large part of this short run
    # (the full run keeps a request waiting 95-99% of the time)
    for system, detail in fig2["details"].items():
        assert detail["waiting_time_share"] > 0.4, system


def test_fig13_paged_batches_at_least_as_many_requests_at_the_papers_rates(fig13):
    m = fig13["measured"]
    for panel in ("sharegpt", "alpaca"):
        for system in CONTIGUOUS:
            assert m[f"{panel}.vllm"] >= m[f"{panel}.{system}"] - 1e-9, (panel, system)
        assert m[f"{panel}.vllm"] > 1.5 * m[f"{panel}.orca_max"], panel
        # a 2048-slot reservation: at most 7 in a 15,728-slot buddy arena
        assert m[f"{panel}.orca_max"] <= 7.0


def test_fig13_saturated_batch_sizes_order_the_systems_strictly(fig13):
    m = fig13["measured"]
    for panel in ("sharegpt", "alpaca"):
        sat = [m[f"{panel}.saturated.{s}"] for s in ("orca_max", "orca_pow2", "orca_oracle", "vllm")]
        assert sat == sorted(sat) and len(set(sat)) == 4, (panel, sat)


def test_fig2_one_command_writes_study_json_and_report(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "experiment=vllm_fig2", "study.scale=0.02",
         "study.workers=1", f"hydra.run.dir={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    study = json.loads((out / "study.json").read_text())
    assert study["kind"] == "study" and study["study"] == "vllm_fig2"
    assert study["setup"]["engine"]["kv_capacity_slots"] == 15728
    assert study["setup"]["model"]["name"] == "opt-13b"
    html = (out / "report.html").read_text()
    assert "Published vs measured" in html and "data:image/png;base64," in html
    assert "<script" not in html and "http://" not in html
