"""The engine loop's garbage-collector settings: frozen objects and a raised young-generation
threshold while a run lasts, both restored afterwards, even when the run fails."""

from __future__ import annotations

import gc

import pytest

from engine_helpers import HARDWARE, MODEL, engine_spec, make_requests, paged
from harness.config.systems import build_manager
from harness.engine import engine
from harness.engine.executors import make_executor
from harness.engine.scheduler import Scheduler


def _run(stop_requested=None):
    spec = engine_spec()
    manager = build_manager(paged(), spec.kv_capacity_slots, MODEL, spec, 4096)
    executor = make_executor(spec, paged(), MODEL, HARDWARE, manager)
    requests = make_requests([(40, 8), (70, 5), (20, 12)], gap=0.01)
    return engine.run_engine(requests, Scheduler(manager, spec), executor, spec,
                             max_model_len=4096, stop_requested=stop_requested)


def test_run_raises_the_young_threshold_and_restores_it():
    before = gc.get_threshold()
    seen = []

    def stop_requested():
        seen.append((gc.get_threshold(), gc.get_freeze_count() > 0))
        return None

    result = _run(stop_requested)
    assert result.complete and seen
    assert {threshold[0] for threshold, _ in seen} == {max(before[0], engine.GC_YOUNG_THRESHOLD)}
    assert {threshold[1:] for threshold, _ in seen} == {before[1:]}
    assert all(frozen for _, frozen in seen)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_settings_restored_when_the_run_raises():
    before = gc.get_threshold()

    def stop_requested():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _run(stop_requested)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_someone_elses_freeze_is_left_alone():
    before = gc.get_threshold()
    gc.freeze()
    try:
        seen = []
        _run(lambda: seen.append(gc.get_threshold()))
        assert set(seen) == {before}  # not ours to change either
        assert gc.get_freeze_count() > 0  # still frozen: not thawed by the run
    finally:
        gc.unfreeze()
