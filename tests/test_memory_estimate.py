"""harness/memory_estimate: the memory a run may use (MemAvailable, the cgroup's limit) and
the refusal of a generated workload that clearly cannot fit."""

from __future__ import annotations

import pytest

import harness.config.memory_estimate as estimate
from harness.errors import ConfigError
from harness.workloads.build import parse_workload

OFFLINE = {"arrival": {"process": "offline"}}
FIXED = {"kind": "fixed", "prompt_len": 8, "output_len": 4, **OFFLINE}


def test_the_cgroup_limit_counts_when_it_is_below_memavailable(tmp_path, monkeypatch):
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text(f"{2 * 2**30}\n")
    usage.write_text(f"{2**29}\n")
    monkeypatch.setattr(estimate, "_CGROUP_V2", (str(limit), str(usage)))
    monkeypatch.setattr(estimate, "_CGROUP_V1", ("/nonexistent", "/nonexistent"))
    monkeypatch.setattr(estimate, "_meminfo_available", lambda: 64 * 2**30)
    assert estimate.available_memory_bytes() == 2 * 2**30 - 2**29
    limit.write_text("max\n")  # no limit: MemAvailable
    assert estimate.available_memory_bytes() == 64 * 2**30


def test_a_generated_workload_is_refused_only_when_its_lower_bound_does_not_fit(monkeypatch):
    monkeypatch.setattr(estimate, "available_memory_bytes", lambda: 2**30)  # 1 GiB
    _, fits = parse_workload({**FIXED, "num_requests": 1_000_000})  # >= 0.93 GiB
    estimate.check_run_fits(fits)
    _, too_many = parse_workload({**FIXED, "num_requests": 2_000_000})
    with pytest.raises(ConfigError, match=r"^workload\.num_requests: 2,000,000 requests need at "
                                          r"least 1\.9 GiB \(1000 bytes each\), more than the "
                                          r"1\.0 GiB of memory available"):
        estimate.check_run_fits(too_many)
    _, trace = parse_workload({"kind": "table", "path": "t.csv", "num_requests": 10**12,
                               "input_column": "i", "output_column": "o", **OFFLINE})
    estimate.check_run_fits(trace)  # a replay is bounded by its file
    monkeypatch.setattr(estimate, "available_memory_bytes", lambda: None)  # unknown: no refusal
    estimate.check_run_fits(too_many)
