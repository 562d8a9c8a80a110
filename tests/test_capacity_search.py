"""The capacity search: bracketing then bisection (harness.studies.capacity), and the
Hydra sweeper that runs it (experiment=capacity) on a workload whose knee is known."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from harness.studies.capacity import Probe, RateSearch, headline

ROOT = Path(__file__).resolve().parents[1]


def search_to_end(search: RateSearch, attainment) -> RateSearch:
    while (rate := search.next_rate()) is not None:
        search.record(Probe(rate, attainment(rate), None, None, f"run{len(search.probes)}"))
    return search


@settings(max_examples=60, deadline=None)
@given(knee=st.floats(0.02, 900.0), start=st.floats(0.01, 1000.0),
       rel_tol=st.sampled_from([0.01, 0.05, 0.2]))
def test_the_search_brackets_the_knee_within_the_tolerance(knee, start, rel_tol):
    search = search_to_end(RateSearch("paged", {}, start, rel_tol=rel_tol, max_probes=60),
                           lambda rate: 1.0 if rate <= knee else 0.5)
    assert search.stop_reason == "converged"
    assert search.lo <= knee < search.hi
    assert search.hi / search.lo - 1 <= rel_tol
    # bracketing doubles or halves: at most log2 of the range, then bisection
    assert len(search.probes) <= 2 + abs(math.log2(knee / start)) + math.log2(1 / rel_tol) + 12


def test_rates_beyond_the_range_stop_the_search_and_say_why():
    low = search_to_end(RateSearch("max", {}, 1.0, min_rate=0.1), lambda rate: 0.0)
    assert low.lo is None and low.stop_reason == "even min_rate=0.1 req/s misses the target"
    assert [p.rate for p in low.probes] == [1.0, 0.5, 0.25, 0.125, 0.1]
    high = search_to_end(RateSearch("paged", {}, 1.0, max_rate=5.0), lambda rate: 1.0)
    assert high.hi is None and high.lo == 5.0 and high.stop_reason.startswith("max_rate=5")
    capped = search_to_end(RateSearch("paged", {}, 1.0, max_probes=3), lambda rate: 1.0)
    assert len(capped.probes) == 3 and capped.stop_reason == "max_probes=3 reached"


def test_the_target_is_inclusive_and_a_missing_attainment_fails():
    search = RateSearch("paged", {}, 2.0, target=0.9)
    search.record(Probe(2.0, 0.9, 1.8, 2.0, "a"))
    assert search.lo == 2.0
    search.record(Probe(4.0, None, None, None, "b"))  # the system served nothing
    assert search.hi == 4.0


def test_headline_names_paged_and_the_best_contiguous_system():
    searches = [{"system": "paged", "point": {}, "capacity_rps": 5.5},
                {"system": "max", "point": {}, "capacity_rps": 3.0},
                {"system": "pow2", "point": {}, "capacity_rps": 3.125}]
    kinds = {"paged": "paged", "max": "contiguous", "pow2": "contiguous"}
    assert headline(searches, kinds) == [
        "At the SLO: paged sustains 5.5 req/s; the best contiguous system, pow2 sustains "
        "3.12 req/s; 1.76x"]


def harness(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=600)


KNEE_SETUP = ("model=tiny", "workload=fixed", "workload.prompt_len=64", "workload.output_len=16",
              "systems=[paged]", "engine.max_num_seqs=1", "report=false", "progress=false")


@pytest.mark.slow
def test_the_capacity_search_finds_a_hand_derived_knee(tmp_path):
    """One request at a time (max_num_seqs=1), every request the same: each takes the
    same service time S (measured alone). Arrivals every g = 1/rate s (gamma, cv 1e-3):
    below 1/S nothing queues; above it request k (from 0) waits k (S - g), so its E2EL is
    S + k (S - g). With the SLO E2EL <= (1 + eps) S, request k is good iff
    k (S - g) <= eps S; attainment >= 90% of N requests needs K = ceil(0.9 N) - 1 of them
    good after the first: the knee is rate* = 1 / (S (1 - eps / K))."""
    alone = harness(*KNEE_SETUP, "workload.num_requests=1", f"hydra.run.dir={tmp_path / 'alone'}")
    assert alone.returncode == 0, alone.stderr
    service_s = json.loads((tmp_path / "alone" / "results.json").read_text())[
        "systems"]["paged"]["serving"]["mean_e2el_ms"] / 1000
    n, eps, tol = 40, 0.05, 0.05
    k = math.ceil(0.9 * n) - 1
    knee = 1 / (service_s * (1 - eps / k))
    sweep = tmp_path / "sweep"
    found = harness("-m", "experiment=capacity", *KNEE_SETUP, f"workload.num_requests={n}",
                    "workload.arrival.process=gamma", "workload.arrival.cv=0.001",
                    "slo.ttft_ms=null", f"slo.e2el_ms={(1 + eps) * service_s * 1000!r}",
                    f"hydra.sweeper.start_rate={0.5 / service_s!r}",
                    f"hydra.sweeper.rel_tol={tol}", f"hydra.sweep.dir={sweep}")
    assert found.returncode == 0, found.stderr
    result = json.loads((sweep / "capacity.json").read_text())
    (search,) = result["searches"]
    assert search["converged"]
    assert search["capacity_rps"] <= knee < search["lowest_failing_rps"]
    assert search["lowest_failing_rps"] / search["capacity_rps"] - 1 <= tol
    # every probe's run is kept, and the report plots them
    for probe in search["probes"]:
        assert (Path(probe["run_dir"]) / "results.json").is_file()
    assert (sweep / "capacity_report.html").is_file()
    assert "At the SLO: paged sustains" in found.stderr


def test_a_capacity_search_without_an_slo_is_refused_in_one_line(tmp_path):
    out = harness("-m", "experiment=capacity", "slo.ttft_ms=null", *KNEE_SETUP,
                  f"hydra.sweep.dir={tmp_path}")
    assert out.returncode == 1
    assert "slo: a capacity search needs an SLO" in out.stderr
    assert "Traceback" not in out.stderr
