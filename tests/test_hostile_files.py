"""Hostile JSON inputs and directory links: results.json nested thousands deep or naming a
key twice is bad input (exit 2) for the gate and ``python -m pagebench.reports``, never a
RecursionError or a silently chosen value; ``python -m pagebench.reports`` does not follow a
symlinked job directory out of a sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import gate
from harness.errors import InputError
from harness.fileio import read_json
from harness.results_format import SCHEMA_VERSION
from harness.run.results import existing_complete_results
from pagebench.reports.__main__ import main as reports_main

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("text, message", [
    (DEEP, "nested too deeply to read"),
    ('{"systems": {}, "systems": {"paged": {}}}', "the key 'systems' appears twice in one object"),
])
def test_read_json_refuses_deep_nesting_and_repeated_keys(tmp_path, text, message, capsys):
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(InputError, match=rf"^{path}: {message}"):
        read_json(path)
    assert existing_complete_results(tmp_path, "x") is None  # not complete: run it again
    assert gate.main([str(path), "--baseline", str(path), "--out", str(tmp_path / "g")]) == 2
    assert reports_main([str(tmp_path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and all(e.startswith(f"error: {path}: {message}") for e in errors)


def test_a_symlinked_job_directory_is_not_followed(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "results.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION}))
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "0").symlink_to(outside, target_is_directory=True)
    from pagebench.reports.sweep import collect_jobs

    assert collect_jobs(sweep) == []
    reports_main([str(sweep)])
    assert sorted(p.name for p in outside.iterdir()) == ["results.json"]  # nothing written there
