"""A sweep does not re-simulate a system whose inputs did not change (harness.run.reuse)."""

from __future__ import annotations

import json

import pytest

import harness.run.reuse
from test_run_parallel import run_in_process


@pytest.fixture
def in_a_sweep(monkeypatch):
    monkeypatch.setattr(harness.run.reuse, "in_sweep", lambda: True)


def files(run_dir, name):
    return [(run_dir / f"{kind}_{name}.csv").read_bytes() for kind in ("steps", "requests")]


def test_a_contiguous_system_is_reused_across_block_sizes_and_equals_a_fresh_run(
        tmp_path, capsys, in_a_sweep, monkeypatch):
    sweep = tmp_path / "sweep"
    first = run_in_process(sweep / "0", "systems=[paged,oracle]", "block_size=8")
    capsys.readouterr()
    second = run_in_process(sweep / "1", "systems=[paged,oracle]", "block_size=16")
    err = capsys.readouterr().err
    assert f"oracle: reused from {first.resolve()}" in err
    assert "paged: reused" not in err  # a paged system reads the block size
    monkeypatch.setenv("PAGEBENCH_RERUN", "1")  # simulate everything: what reuse must equal
    fresh = run_in_process(tmp_path / "fresh" / "1", "systems=[paged,oracle]", "block_size=16")
    assert "reused" not in capsys.readouterr().err
    assert files(second, "oracle") == files(fresh, "oracle") == files(first, "oracle")
    got, want = (json.loads((d / "results.json").read_text()) for d in (second, fresh))
    assert got["systems"] == want["systems"]
    assert got["system_inputs"] == want["system_inputs"]
    assert got["system_inputs"]["paged"] != json.loads(
        (first / "results.json").read_text())["system_inputs"]["paged"]


def test_other_inputs_or_a_run_outside_a_sweep_simulate_again(tmp_path, capsys, monkeypatch):
    sweep = tmp_path / "sweep"
    monkeypatch.setattr(harness.run.reuse, "in_sweep", lambda: True)
    run_in_process(sweep / "0", "systems=[oracle]", "block_size=8")
    run_in_process(sweep / "1", "systems=[oracle]", "block_size=16", "seed=1")  # another seed
    monkeypatch.setattr(harness.run.reuse, "in_sweep", lambda: False)
    run_in_process(sweep / "2", "systems=[oracle]", "block_size=16")  # not a sweep's job
    assert "reused" not in capsys.readouterr().err
