"""The system summary computes without numpy's huge-page requests, and leaves numpy's
setting as it found it (harness.run.serve._without_huge_pages)."""

from __future__ import annotations

import pytest
from numpy._core.multiarray import _get_madvise_hugepage, _set_madvise_hugepage

from harness.run.serve import _without_huge_pages


@pytest.mark.parametrize("setting", [True, False])
def test_huge_pages_off_within_and_restored_after(setting):
    previous = _set_madvise_hugepage(setting)
    try:
        with _without_huge_pages():
            assert _get_madvise_hugepage() is False
        assert _get_madvise_hugepage() is setting
        with pytest.raises(KeyError), _without_huge_pages():
            raise KeyError("a failing summary")
        assert _get_madvise_hugepage() is setting
    finally:
        _set_madvise_hugepage(previous)
