"""A system's work after its engine run (phase columns, tables, summary) runs with the
garbage collector paused, the engine itself as before; the collector is on again after the
system, after a failure too, and a run that found it off leaves it off
(harness.run.serve._run_system)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from harness.run import serve

ROOT = Path(__file__).resolve().parents[1]


def run_serving(out_dir: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["workload=fixed", "workload.num_requests=12",
                                           "progress=false", "report=false", "jobs=1",
                                           "systems=[paged,max]"])
    GlobalHydra.instance().clear()
    out_dir.mkdir(parents=True)
    serve.run_serving(cfg, out_dir)


@pytest.fixture
def collector_seen(monkeypatch):
    """Whether the collector was on in each engine run and each table write, in order."""
    seen = []
    run_engine, write_table = serve.run_engine, serve.write_table

    def engine_probe(*args, **kwargs):
        seen.append(("engine", gc.isenabled()))
        return run_engine(*args, **kwargs)

    def table_probe(path, frame):
        seen.append((path.name, gc.isenabled()))
        write_table(path, frame)

    monkeypatch.setattr(serve, "run_engine", engine_probe)
    monkeypatch.setattr(serve, "write_table", table_probe)
    return seen


def test_the_tables_are_written_with_the_collector_paused_and_it_resumes(tmp_path,
                                                                          collector_seen):
    assert gc.isenabled()
    run_serving(tmp_path / "run")
    assert collector_seen == [("engine", True), ("steps_paged.csv", False),
                              ("requests_paged.csv", False), ("engine", True),
                              ("steps_max.csv", False), ("requests_max.csv", False)]
    assert gc.isenabled()


def test_the_collector_resumes_after_a_failing_table(tmp_path, monkeypatch):
    def failing(path, frame):
        raise OSError("disk full")

    monkeypatch.setattr(serve, "write_table", failing)
    with pytest.raises(OSError):
        run_serving(tmp_path / "run")
    assert gc.isenabled()


def test_a_run_that_found_the_collector_off_leaves_it_off(tmp_path, collector_seen):
    gc.disable()
    try:
        run_serving(tmp_path / "run")
        assert not gc.isenabled()
        assert {enabled for _, enabled in collector_seen} == {False}
    finally:
        gc.enable()
