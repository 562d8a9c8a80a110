"""The run report's headline sentence: which systems it compares, and by what."""

from __future__ import annotations

import re

from pagebench.reports.headline import headline_sentence as _headline_sentence


def system(kind: str, token_states: float, idle: float, rps: float) -> dict:
    """A results.json system entry with just what the headline reads."""
    return {"allocator": {"kind": kind}, "requests": {"rejected": 0},
            "memory": {"token_states_pct": token_states, "idle_pct": idle},
            "batch": {"mean_seqs": 4.0}, "throughput": {"requests_per_s": rps}}


def test_the_contiguous_system_named_is_the_one_that_wasted_least():
    # max serves the most requests/s (as on engine=torch, where timings are noise) but wastes
    # 90% of the memory it uses; oracle wastes 20%: the waste sentence must name oracle
    systems = {"paged": system("paged", 95.0, 0.0, 1.0),
               "max": system("contiguous", 10.0, 0.0, 2.0),
               "oracle": system("contiguous", 80.0, 0.0, 1.5)}
    sentence = _headline_sentence(systems)
    assert "<b>oracle</b>" in sentence and "max" not in sentence
    assert "the contiguous system that wasted the least" in sentence
    assert re.search(r"5\.0% of the KV memory .* vs 20\.0%", sentence)


def test_a_group_that_used_no_memory_gives_no_headline():
    systems = {"paged": system("paged", 95.0, 0.0, 1.0),
               "max": system("contiguous", 0.0, 100.0, 2.0)}
    assert _headline_sentence(systems) is None
