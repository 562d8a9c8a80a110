"""benchmarks/cpu/manager_replay.py: a run's manager calls replayed alone give the same results."""

import dataclasses
import importlib.util
import json
import pickle
from collections import Counter
from pathlib import Path

from pagebench.allocators.block_pool import BlockPool
from pagebench.allocators.paged import PagedKVCacheManager

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["workload=docqa", "workload.num_requests=30", "workload.num_samples=2",
         "engine.kv_capacity_slots=6000"]


def load_script():
    spec = importlib.util.spec_from_file_location("manager_replay",
                                                  ROOT / "benchmarks/cpu/manager_replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class MiscountingManager(PagedKVCacheManager):
    """Claims one cached token too many at every admission."""

    def admit(self, *args):
        admission = super().admit(*args)
        if admission is None:
            return None
        return dataclasses.replace(admission, num_cached_tokens=admission.num_cached_tokens + 1)


def test_a_recorded_run_replays_with_identical_results(tmp_path):
    script = load_script()
    calls = tmp_path / "calls.pkl"
    admit = PagedKVCacheManager.admit
    summary = script.record(calls, SMALL, "paged")
    assert summary["calls"] > 100 and summary["run_cpu_s"] > 0
    assert PagedKVCacheManager.admit is admit  # the recorder put the methods back
    out = tmp_path / "replay.json"
    assert script.main(["replay", str(calls), "--rounds", "2", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["mismatches"] == [] and figures["calls"] == summary["calls"] - 1  # __init__
    assert len(figures["replay_cpu_s_runs"]) == 2 and 0 < figures["share_of_run"]
    methods = figures["by_method"]
    assert {"admit", "append", "append_batch", "free", "fork", "can_append_without_copy",
            "breakdown"} <= set(methods)  # parallel samples: forks and copy-on-write too
    assert sum(m["calls"] for m in methods.values()) == figures["calls"]
    with open(calls, "rb") as handle:
        recorded = pickle.load(handle)["calls"]
    assert any(name == "append" and copies for name, _, copies in recorded)  # compared too


def test_a_manager_that_answers_differently_is_caught(tmp_path):
    script = load_script()
    calls = tmp_path / "calls.pkl"
    script.record(calls, [*SMALL, "workload.num_samples=1", "engine.kv_capacity_slots=3000"],
                  "paged")
    figures = script.replay(calls, 1, f"{__name__}:MiscountingManager")
    assert figures["mismatches"], "a wrong answer went unnoticed"
    assert figures["mismatches"][0].split(":")[0].endswith(" admit")


def test_shares_times_the_manager_and_its_pool_within_the_run(tmp_path):
    script = load_script()
    allocate = BlockPool.allocate
    figures = script.shares(SMALL, "paged")
    manager, pool = figures["manager"], figures["block_pool"]
    assert 0 < pool["seconds"] <= manager["seconds"] <= figures["run_s"]
    assert {"allocate", "free", "touch_many"} <= set(pool["by_method"])  # forks touch tables
    assert BlockPool.allocate is allocate  # the timers put the methods back
    # the outermost calls, as recorded (an ``append`` made by ``append_batch`` is not one)
    calls = tmp_path / "calls.pkl"
    script.record(calls, SMALL, "paged")
    with open(calls, "rb") as handle:
        recorded = Counter(name for name, _, _ in pickle.load(handle)["calls"])
    del recorded["__init__"]
    assert {name: m["calls"] for name, m in manager["by_method"].items()} == recorded
