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


def _setup(*overrides: str):
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.run.run_setup import run_setup

    GlobalHydra.instance().clear()
    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny", *overrides])
    GlobalHydra.instance().clear()
    return run_setup(cfg)


@pytest.mark.parametrize("system, block", [("paged", 1), ("paged", 16), ("radix", 1)])
def test_a_pools_footprint_is_extrapolated_within_ten_percent(system, block):
    import tracemalloc

    from harness.config.systems import build_manager, cpu_pool_slots

    setup = _setup(f"block_size={block}", f"systems=[{system}]", "engine.swap_space_gib=0.5")
    [spec] = setup.systems
    capacity = 300_000 * block
    estimated = estimate.pool_bytes(spec, capacity, cpu_pool_slots(setup.model, setup.engine),
                                    setup.max_model_len, setup.model, setup.engine)
    tracemalloc.start()
    manager = build_manager(spec, capacity, setup.model, setup.engine, setup.max_model_len)
    built = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert manager.capacity_slots <= capacity
    assert 0.9 * built <= estimated <= 1.1 * built, (estimated, built)


def test_a_pool_too_large_to_build_is_refused_with_its_figure(monkeypatch):
    monkeypatch.setattr(estimate, "available_memory_bytes", lambda: 2**30)  # 1 GiB
    setup = _setup("block_size=1", "systems=[paged,max]")  # (the pool is given below)
    with pytest.raises(ConfigError, match=r"^systems: paged's KV pool of block 1 over "
                                          r"130,395,399 slots \(\+ 4,194,304 swap slots\) takes "
                                          r"about \d+\.\d GiB of Python memory to build, more "
                                          r"than the 1\.0 GiB available; raise block_size"):
        estimate.check_pools_fit(setup.systems, 130_395_399, 4_194_304, setup.max_model_len,
                                 setup.model, setup.engine)
    estimate.check_pools_fit(setup.systems, 130_395_399 // 64, 0, setup.max_model_len,
                             setup.model, setup.engine)  # 2 M blocks: about 0.13 GiB, it fits
