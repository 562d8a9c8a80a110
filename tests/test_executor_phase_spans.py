"""The operator model's phase columns: fast-forwarded spans recorded as one record each
(``SimExecutor.decoded_span``) give, bit for bit, the columns of their steps executed one
by one, interleaved with executed steps in any order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine_helpers import HARDWARE, MODEL
from harness.config.specs import CostSpec
from harness.engine.cost_operator import OperatorCostModel
from harness.engine.plan import ScheduledChunk, StepPlan
from harness.engine.sim_executor import PHASE_COLUMNS, SimExecutor

SMALL = str(Path(__file__).parent / "data" / "kernel_results_small.json")


def _executor(profile: str, results: str | None, tmp_path) -> SimExecutor:
    host = tmp_path / "host.yaml"
    host.write_text("name: test\ncomponents:\n  a: {per_step_s: 0.001, per_seq_s: 0.0001}\n")
    cost = CostSpec(kernel_profile=profile, host_profile=str(host), kernel_results=results)
    return SimExecutor(OperatorCostModel(MODEL, HARDWARE, cost, "paged", 16), 16)


def _plan(positions: list[int], prompt: int = 0) -> StepPlan:
    """Decodes of the sequences at ``positions``, and a prompt chunk of ``prompt`` tokens."""
    plan = StepPlan()
    plan.add_decodes([None] * len(positions), list(positions))
    if prompt:
        seq = SimpleNamespace(seq_id=10**6, num_tokens=prompt, generated=[])
        plan.add_chunk(ScheduledChunk(seq, 0, prompt))
    return plan


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("profile, results", [("ideal", None), ("measured", SMALL)])
def test_spans_give_the_phase_columns_of_their_steps_one_by_one(tmp_path, seed, profile,
                                                                 results):
    rng = np.random.default_rng(seed)
    spans, steps = _executor(profile, results, tmp_path), _executor(profile, results, tmp_path)
    for _ in range(int(rng.integers(0, 60))):
        positions = [int(p) for p in rng.integers(1, 3000, int(rng.integers(1, 40)))]
        if rng.random() < 0.4:  # an executed step, some with a prompt chunk
            plan = _plan(positions, int(rng.integers(0, 3)) * 50)
            assert spans.execute(plan) == steps.execute(plan)
            continue
        # a span priced for some steps (long ones on numpy), of which the first ran
        priced = int(rng.choice([1, 5, 20, 64, 65, 200]))
        ran = int(rng.integers(0, priced + 1))
        total = sum(positions)
        durations = spans.decode_durations(total, len(positions), priced, positions)
        spans.decoded_span(total, len(positions), ran, positions)
        for i in range(ran):
            seconds, _ = steps.execute(_plan([p + i for p in positions]))
            assert seconds == durations[i]
    got, expected = spans.phase_columns(), steps.phase_columns()
    assert list(got) == list(expected) == list(PHASE_COLUMNS)
    for name in PHASE_COLUMNS:
        assert got[name].dtype == expected[name].dtype == np.float64
        assert got[name].tobytes() == expected[name].tobytes(), name
    assert spans.decode_read_slots == steps.decode_read_slots
    assert spans.cost_report() == steps.cost_report()
    # the steps' phases are let go of: a second call has none
    assert all(len(column) == 0 for column in spans.phase_columns().values())


def test_a_span_the_executor_did_not_price_last_is_priced_again(tmp_path):
    spans, steps = _executor("ideal", None, tmp_path), _executor("ideal", None, tmp_path)
    spans.decode_durations(100, 2, 3, [40, 60])  # another span priced last
    spans.decoded_span(30, 2, 4, [10, 20])
    for i in range(4):
        steps.execute(_plan([10 + i, 20 + i]))
    got, expected = spans.phase_columns(), steps.phase_columns()
    assert all(got[name].tobytes() == expected[name].tobytes() for name in PHASE_COLUMNS)
