"""docs/managers.md's complete small manager, run end to end: its code block registers
it, a catalog entry selects it, and it serves a workload through the engine and the
protocol state machine like every registered manager."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import settings

import test_alloc_registry as registry
from pagebench.allocators.registry import MANAGERS
from engine_helpers import engine_spec, make_requests, paged, run
from harness.config.specs import select_systems

DOC = (Path(__file__).parents[1] / "docs/managers.md").read_text()


@pytest.fixture(scope="module")
def per_token():
    section = DOC.split("## A complete small manager", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/managers.md", "exec"), namespace)
    catalog = {**registry.CATALOG, "per_token": {"kind": "per_token"}}
    yield select_systems(["per_token"], catalog, 16)[0]
    del MANAGERS["per_token"]


def test_the_documented_manager_is_about_a_hundred_lines():
    section = DOC.split("## A complete small manager", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 80 <= len(code.splitlines()) <= 120


def test_the_documented_manager_serves_a_workload_like_the_paged_one(per_token):
    requests = make_requests([(30, 20), (200, 50), (64, 300), (10, 5)] * 3, gap=0.005)
    spec = engine_spec(kv_capacity_slots=512)
    mine, reference = run(requests, per_token, spec), run(requests, paged(16), spec)
    assert mine.complete and mine.output_digest == reference.output_digest
    steps = mine.recorder.steps
    assert max(steps["num_preempted"]) > 0  # the pool is small: it preempts and recovers
    for i in range(len(steps["step"])):
        parts = sum(steps[name][i] for name in ("token_states", "reserved", "internal_over_reservation",
                                                "internal_rounding", "external_fragmentation", "idle"))
        assert parts == 512 and steps["allocated_slots"][i] == steps["token_states"][i]


def test_the_documented_manager_passes_the_protocol_state_machine(per_token):
    machine = type("Protocol_per_token", (registry.ProtocolMachine,), {"system": per_token})
    case = machine.TestCase
    case.settings = settings(registry.SETTINGS, max_examples=8)
    case("runTest").runTest()
