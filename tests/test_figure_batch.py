"""Drawing a report's figures in worker processes: same page, errors surface, safe fallback."""

from __future__ import annotations

import os
import threading

import matplotlib.pyplot as plt
import pandas as pd
import pytest

import pagebench.reports.figure_batch as FB
from pagebench.reports.figure_batch import PendingFigure, parallel_workers, resolve
from pagebench.reports.render import render_run_report
from test_report import small_run


def _line(value: float):
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1], [0, value])
    return fig


def _broken():
    raise ValueError("no data for this figure")


@pytest.fixture
def two_workers(monkeypatch):
    """Draw in two forked workers from the first figure on, whatever this machine has."""
    monkeypatch.setattr(FB, "MIN_PARALLEL", 1)
    monkeypatch.setattr(FB, "parallel_workers", lambda n: 2)


def test_resolve_puts_each_figure_in_its_place(two_workers):
    parts = ["<h2>a</h2>", PendingFigure(lambda: _line(1.0), "one", "first"), "<p>b</p>",
             PendingFigure(lambda: _line(2.0), "two")]
    page = resolve(parts)
    assert page[0] == "<h2>a</h2>" and page[2] == "<p>b</p>"
    assert page[1].startswith("<figure><img alt='one' src='data:image/png;base64,")
    assert page[1].endswith("<figcaption>first</figcaption></figure>")
    assert "alt='two'" in page[3] and "figcaption" not in page[3]
    assert page[1] != page[3]


def test_a_failing_figure_raises_its_own_error_from_the_worker(two_workers):
    with pytest.raises(ValueError, match="no data for this figure"):
        resolve([PendingFigure(lambda: _line(1.0), "ok"), PendingFigure(_broken, "broken")])


def test_the_report_is_byte_identical_drawn_in_workers_or_here(tmp_path, monkeypatch):
    run_dir = small_run(tmp_path / "run", "report=false")
    pd.DataFrame({"time_s": [0.0, 0.1, 0.2], "power_w": [300.0, 420.0, 410.0],
                  "system": ["paged"] * 3}).to_csv(run_dir / "nvml_samples.csv", index=False)
    monkeypatch.setattr(FB, "parallel_workers", lambda n: 1)
    here = render_run_report(run_dir).read_bytes()
    monkeypatch.setattr(FB, "parallel_workers", lambda n: 2)
    open_before = plt.get_fignums()
    assert render_run_report(run_dir).read_bytes() == here
    assert here.count(b"<figure>") >= FB.MIN_PARALLEL and b"GPU telemetry over time" in here
    assert plt.get_fignums() == open_before  # none left open here by what the workers drew


def test_few_figures_or_another_thread_keep_drawing_here():
    assert parallel_workers(FB.MIN_PARALLEL - 1) == 1
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert parallel_workers(100) == 1  # a fork would copy locks that thread may hold
    finally:
        stop.set()
        other.join()


def test_a_worker_that_dies_leaves_the_figures_to_this_process(two_workers):
    parent = os.getpid()

    def dies_in_a_worker():
        if os.getpid() != parent:
            os._exit(1)  # as a worker killed for memory would
        return _line(3.0)

    page = resolve([PendingFigure(lambda: _line(1.0), "one"), PendingFigure(dies_in_a_worker, "two")])
    assert [part.startswith("<figure><img alt=") for part in page] == [True, True]


def test_ctrl_c_while_drawing_keeps_the_results_and_says_how_to_draw_them(tmp_path, monkeypatch,
                                                                           capsys):
    import pagebench.reports.render

    def interrupted(run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(pagebench.reports.render, "render_run_report", interrupted)
    with pytest.raises(KeyboardInterrupt):
        small_run(tmp_path / "run")
    assert (tmp_path / "run" / "results.json").is_file()
    assert not (tmp_path / "run" / "report.html").exists()
    assert (f"report.html not drawn; the results are written: the same command again (or python "
            f"-m pagebench.reports {tmp_path / 'run'}) draws it") in capsys.readouterr().err
