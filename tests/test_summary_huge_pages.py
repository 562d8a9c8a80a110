"""The system summary computes without numpy's huge-page requests, and leaves numpy's
setting as it found it (harness.run.huge_pages.without_huge_pages)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.run import serve
from harness.run.huge_pages import huge_pages_requested, set_huge_pages, without_huge_pages


@pytest.mark.parametrize("setting", [True, False])
def test_huge_pages_off_within_and_restored_after(setting):
    previous = set_huge_pages(setting)
    try:
        if huge_pages_requested() is not setting:
            pytest.skip("this numpy has no huge-page switch")
        with without_huge_pages():
            assert huge_pages_requested() is False
        assert huge_pages_requested() is setting
        with pytest.raises(KeyError), without_huge_pages():
            raise KeyError("a failing summary")
        assert huge_pages_requested() is setting
    finally:
        set_huge_pages(previous)


def test_the_system_summary_runs_without_huge_pages(monkeypatch):
    seen = []

    def probe(steps, requests):
        seen.append(huge_pages_requested())
        raise KeyError("stop")

    monkeypatch.setattr(serve, "serving_summary", probe)
    previous = set_huge_pages(True)
    try:
        if not huge_pages_requested():
            pytest.skip("this numpy has no huge-page switch")
        with pytest.raises(KeyError):
            serve._system_summary(None, SimpleNamespace(scheduler=None), None, None, None)
        assert seen == [False] and huge_pages_requested() is True
    finally:
        set_huge_pages(previous)
