"""The run report: drawing its figures in this process vs in worker processes."""

from __future__ import annotations

import pytest

from _setup import compose


@pytest.fixture(scope="module")
def docqa_run_dir(tmp_path_factory):
    """The default docqa run's result files (four systems), without a report."""
    from harness.run.serve import run_serving

    out = tmp_path_factory.mktemp("docqa")
    run_serving(compose("workload=docqa", "report=false", "progress=false"), out)
    return out


@pytest.mark.parametrize("drawing", ["here", "workers"])
def bench_render_run_report_docqa(benchmark, docqa_run_dir, drawing, monkeypatch):
    """One call: ``render_run_report`` of the default docqa run (10 figures)."""
    import pagebench.reports.figure_batch as figure_batch
    from pagebench.reports.render import render_run_report

    if drawing == "here":
        monkeypatch.setattr(figure_batch, "parallel_workers", lambda n: 1)
    elif figure_batch.parallel_workers(10) < 2:
        pytest.skip("one CPU, or forking is not safe here: the workers are not used")
    out = benchmark.pedantic(render_run_report, args=(docqa_run_dir,), rounds=5, warmup_rounds=1)
    assert out.read_text(encoding="utf-8").count("<figure>") == 10
