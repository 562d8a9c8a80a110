"""Claims of the form "at least": more than the article measured bears the claim out."""

from __future__ import annotations

from pagebench.reports.claims import FAILS, HOLDS, NOT_MEASURED, evaluate_claims
from pagebench.reports.rundata import RunData


def run_with_contiguous_waste(token_states_pct: float) -> RunData:
    """A run whose one contiguous system used all of its pool, ``token_states_pct`` of it
    holding token states (waste = 100 - token_states_pct)."""
    system = {"allocator": {"kind": "contiguous", "policy": "oracle"}, "steps": 10,
              "memory": {"token_states_pct": token_states_pct, "idle_pct": 0.0}}
    return RunData(run_dir=None, results={"systems": {"oracle": system},
                                          "workload": {"kind": "sharegpt_like"}})


def verdict(token_states_pct: float) -> tuple[str, str]:
    rows = [r for r in evaluate_claims(run_with_contiguous_waste(token_states_pct))
            if r.claim_id == "contiguous_waste"]
    assert len(rows) == 1
    return rows[0].expected, rows[0].verdict


def test_contiguous_waste_above_the_articles_range_holds_the_claim():
    assert verdict(10.0) == ("≥ 60", HOLDS)   # 90% waste: more than the article's 60-80%
    assert verdict(30.0) == ("≥ 60", HOLDS)   # 70%: inside it


def test_contiguous_waste_below_the_claim_does_not_hold():
    assert verdict(55.0) == ("≥ 60", FAILS)   # 45% waste


def test_contiguous_waste_is_not_compared_on_a_workload_the_article_did_not_measure():
    run = run_with_contiguous_waste(62.0)  # 38% waste, as the default docqa run's pow2
    run.results["workload"] = {"kind": "docqa"}
    [row] = [r for r in evaluate_claims(run) if r.claim_id == "contiguous_waste"]
    assert row.verdict == NOT_MEASURED
    assert row.how.startswith("not comparable: the article measured it on sharegpt_like")
    assert "this run's workload is docqa (compare with workload=sharegpt_like)" in row.how
