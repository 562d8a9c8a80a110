"""The sweep report, its Hydra callback, the ready-made experiments and the launcher presets."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from harness.errors import InputError
from pagebench.reports.callbacks import SweepReportCallback
from pagebench.reports.html import fmt
from pagebench.reports.sweep import (FAILED, FINISHED, MISSING, collect_jobs, expected_jobs, parse_overrides,
                           render_sweep_report, set_aside_earlier_jobs)
from test_report import parse, small_run

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("block_size_sweep", "rate_sweep", "allocator_comparison")
PRESETS = {"local_parallel": "hydra_joblib_launcher", "local_submitit": "hydra_submitit_launcher",
           "slurm": "hydra_submitit_launcher", "ray_cluster": "hydra_ray_launcher"}


@pytest.fixture(scope="module")
def one_run(tmp_path_factory) -> Path:
    return small_run(tmp_path_factory.mktemp("sweep_src") / "run", "systems=[paged,oracle]",
                     "workload.num_requests=20", "report=false")  # (its results and tables)


def fake_sweep(root: Path, one_run: Path) -> Path:
    """A multirun dir: block_size=8,16,32,64 swept; 8 and 16 finished, 32 failed, 64 never ran."""
    sweep = root / "sweep"
    sweep.mkdir()
    OmegaConf.save(OmegaConf.create({
        "hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                              "params": {}},
                  "overrides": {"task": ["workload=docqa", "block_size=8,16,32,64"]}},
        "experiment": {"name": "t", "focus": ["waste_pct"]}}), sweep / "multirun.yaml")
    for num, block in enumerate((8, 16, 32)):
        job = sweep / str(num)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump(["workload=docqa", f"block_size={block}"]))
        if block == 32:
            (job / "job_failed.txt").write_text("Traceback ...\nConfigError: block_size: boom\n")
            continue
        data = json.loads((one_run / "results.json").read_text())
        data["block_size"] = block
        data["systems"]["paged"]["memory"]["token_states_pct"] = 40.0 + block / 100
        (job / "results.json").write_text(json.dumps(data))
    return sweep


def test_overrides_and_expected_jobs(tmp_path, one_run):
    assert parse_overrides(["block_size=16", "+x.y=a", "systems=[paged,max]", "hydra.job.chdir=1"]) \
        == {"block_size": 16, "x.y": "a", "systems": "[paged,max]"}
    sweep = fake_sweep(tmp_path, one_run)
    assert expected_jobs(sweep) == [["workload=docqa", f"block_size={b}"] for b in (8, 16, 32, 64)]
    jobs = {tuple(j.overrides)[-1]: j for j in collect_jobs(sweep)}
    assert [jobs[f"block_size={b}"].status for b in (8, 16, 32, 64)] == \
        [FINISHED, FINISHED, FAILED, MISSING]
    assert jobs["block_size=32"].reason == "ConfigError: block_size: boom"


def test_a_sweep_sets_aside_the_jobs_of_an_earlier_sweep_that_it_does_not_run(tmp_path, one_run,
                                                                              capsys):
    """block_size=8,16,32 ran here before; block_size=16,64 now: the job directories of 8 and
    32 move to previous/1/ (whole, with their results); 16's stays, for its job to skip or
    set aside itself, and the report counts this sweep's jobs only."""
    sweep = fake_sweep(tmp_path, one_run)
    config = OmegaConf.create({"hydra": {
        "sweep": {"dir": str(sweep)}, "mode": "MULTIRUN",
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                    "params": {}},
        "overrides": {"task": ["workload=docqa", "block_size=16,64"]}}})
    SweepReportCallback(enabled=False).on_multirun_start(config)
    assert sorted(p.name for p in sweep.iterdir()) == ["1", "previous"]
    moved = sweep / "previous" / "1"
    assert sorted(p.name for p in moved.iterdir()) == ["0", "2", "multirun.yaml"]
    assert (moved / "0" / "results.json").exists() and (moved / "2" / "job_failed.txt").exists()
    assert capsys.readouterr().err.splitlines() == [
        f"sweep: 2 job directories of an earlier sweep here, not in this one, moved to {moved}",
        f"sweep: 2 jobs -> {sweep}"]
    # run again with nothing stale: nothing moves; a second set-aside takes previous/2
    assert set_aside_earlier_jobs(sweep, [["workload=docqa", "block_size=16"]]) == (None, 0)
    assert set_aside_earlier_jobs(sweep, [["workload=docqa", "block_size=64"]]) == (
        sweep / "previous" / "2", 1)


def test_sweep_report_aggregates_what_finished_and_lists_what_did_not(tmp_path, one_run):
    sweep = fake_sweep(tmp_path, one_run)
    out = render_sweep_report(sweep)
    assert out == sweep / "sweep_report.html"
    report = parse(out)
    unfinished = {row[2]: row for row in report.tables["unfinished-table"][1:]}
    assert set(unfinished) == {FAILED, MISSING}
    assert "boom" in unfinished[FAILED][3] and "block_size=64" in unfinished[MISSING][1]
    rows = report.tables["sweep-table"]
    header, body = rows[0], rows[1:]
    assert header[:4] == ["job", "status", "block_size", "system"]
    assert [(r[2], r[3]) for r in body] == [("8", "oracle"), ("8", "paged"), ("16", "oracle"),
                                            ("16", "paged")]
    token_col = header.index("token states (% of KV pool)")
    assert body[3][token_col] == fmt(40.16, 3)
    # every metric vs block_size, and the block-size effects (reports/block_size_effects.py)
    assert len(report.images) == 2
    text = out.read_text()
    # the experiment's focus metric is drawn first; the table is saved as CSV too
    assert "Metrics vs block_size" in text
    table = pd.read_csv(sweep / "sweep_results.csv")
    assert len(table) == 4 and set(table["system"]) == {"paged", "oracle"}
    assert table["preemptions"].dtype.kind == "i"


def test_a_sweep_stopped_before_its_end_gets_its_report_when_the_process_exits(
        tmp_path, one_run, monkeypatch, capsys):
    """Ctrl-C skips on_multirun_end: the report is drawn at exit, once, and only then."""
    at_exit = []
    monkeypatch.setattr("pagebench.reports.callbacks.atexit.register",
                        lambda fn, *args: at_exit.append(lambda: fn(*args)))
    sweep = fake_sweep(tmp_path, one_run)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}, "mode": "MULTIRUN", "overrides": {
        "task": ["workload=docqa", "block_size=8,16,32,64"]}}})  # the fake sweep's own jobs
    ended = SweepReportCallback()
    ended.on_multirun_start(config)
    ended.on_multirun_end(config)
    (sweep / "sweep_report.html").unlink()
    stopped = SweepReportCallback()
    stopped.on_multirun_start(config)
    [ended_at_exit, stopped_at_exit] = at_exit
    ended_at_exit()
    assert not (sweep / "sweep_report.html").exists()
    stopped_at_exit()
    assert (sweep / "sweep_report.html").exists()
    assert "sweep stopped before its end: drawing the report of what finished" in \
        capsys.readouterr().err


def test_counts_stay_integers_in_the_csv_when_some_rows_lack_them():
    from pagebench.reports.sweep import _with_int_counts

    frame = pd.DataFrame({"preemptions": [9.0, None, 3.0], "waste_pct": [63.5, None, 1.0]})
    text = _with_int_counts(frame).to_csv(index=False)
    assert text.splitlines() == ["preemptions,waste_pct", "9,63.5", ",", "3,1.0"]


def test_callback_records_a_failed_job_and_renders_the_report(tmp_path, one_run):
    sweep = fake_sweep(tmp_path, one_run)
    (sweep / "2" / "job_failed.txt").unlink()
    config = OmegaConf.create({"hydra": {"mode": "MULTIRUN", "sweep": {"dir": str(sweep)},
                                         "runtime": {"output_dir": str(sweep / "2")},
                                         "job": {"num": 2}}})
    failed = JobReturn(status=JobStatus.FAILED, _return_value=ValueError("bad value"))
    SweepReportCallback().on_job_end(config, failed)
    assert "ValueError: bad value" in (sweep / "2" / "job_failed.txt").read_text()
    assert "bad value" in (sweep / "sweep_report.html").read_text()
    (sweep / "sweep_report.html").unlink()
    SweepReportCallback().on_multirun_end(config)
    assert (sweep / "sweep_report.html").exists()


def test_python_m_reports_renders_a_sweep_and_its_jobs(tmp_path, one_run):
    from pagebench.reports.__main__ import main

    sweep = fake_sweep(tmp_path, one_run)
    shutil.copy(one_run / "steps_paged.csv", sweep / "0")
    assert main([str(sweep), "--no-jobs"]) == 0
    assert (sweep / "sweep_report.html").exists() and not (sweep / "0" / "report.html").exists()
    with pytest.raises(InputError, match="no job directories"):
        render_sweep_report(tmp_path / "sweep" / "2" / ".hydra")


def compose(*overrides: str, hydra_cfg: bool = False):
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            return hydra_compose("config", overrides=list(overrides),
                                 return_hydra_config=hydra_cfg)
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiments_compose_with_a_sweep_and_valid_systems(name):
    from harness.config.specs import select_systems

    cfg = compose(f"experiment={name}", hydra_cfg=True)
    assert cfg.experiment.name == name
    params = dict(cfg.hydra.sweeper.params)
    assert len(params) == 1 and len(str(next(iter(params.values()))).split(",")) >= 3
    assert f"multirun/{name}/" in cfg.hydra.sweep.dir
    systems = select_systems(cfg.systems, cfg.allocator, cfg.block_size)
    assert {s.kind for s in systems} == {"paged", "contiguous"}
    if name == "allocator_comparison":
        cfg = compose(f"experiment={name}", "experiment.arena=first_fit")
        arenas = {s.arena for s in select_systems(cfg.systems, cfg.allocator, 16)
                  if s.kind == "contiguous"}
        assert arenas == {"first_fit"}


def test_the_callback_is_configured():
    cfg = compose(hydra_cfg=True)
    assert cfg.hydra.callbacks.sweep_report._target_ == "pagebench.reports.callbacks.SweepReportCallback"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_launcher_presets_compose(preset):
    if importlib.util.find_spec(f"hydra_plugins.{PRESETS[preset]}") is None:
        pytest.skip(f"{PRESETS[preset]} is not installed (pip install -e '.[sweeps]')")
    cfg = compose(f"hydra/launcher={preset}", hydra_cfg=True)
    target = cfg.hydra.launcher._target_
    assert target.startswith(f"hydra_plugins.{PRESETS[preset]}.")
    if preset == "ray_cluster":
        assert cfg.hydra.launcher.ray.init.object_store_memory is None


def test_an_incomplete_job_is_marked_in_the_figure_and_every_figure_has_a_caption(tmp_path, one_run):
    """A job that stopped early (complete: false) is circled in the figure, with its own
    legend entry; a finished sweep draws no such entry."""
    from pagebench.reports.sweep import STOPPED_LABEL, aggregate, sweep_figure

    sweep = fake_sweep(tmp_path, one_run)
    stopped = sweep / "1" / "results.json"
    data = json.loads(stopped.read_text())
    data["complete"] = False
    stopped.write_text(json.dumps(data))
    frame, swept = aggregate(collect_jobs(sweep))
    metrics = [("token_states_pct", "token states")]
    labels = [t.get_text() for t in sweep_figure(frame, "block_size", [], metrics, {}).legends[0].texts]
    assert STOPPED_LABEL in labels
    finished = frame.assign(status=FINISHED)
    labels = [t.get_text() for t in sweep_figure(finished, "block_size", [], metrics, {}).legends[0].texts]
    assert STOPPED_LABEL not in labels
    text = render_sweep_report(sweep).read_text()
    assert text.count("<figure>") == text.count("<figcaption>") > 0


def test_ctrl_c_while_the_sweep_report_is_drawn_exits_130_without_a_traceback(tmp_path,
                                                                            monkeypatch, capsys):
    def interrupted(sweep_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr("pagebench.reports.sweep.render_sweep_report", interrupted)
    with pytest.raises(SystemExit) as stop:
        SweepReportCallback()._render(tmp_path)
    assert stop.value.code == 130
    assert capsys.readouterr().err == (f"interrupted: sweep report not written; draw it with: "
                                       f"python -m pagebench.reports {tmp_path}\n")
