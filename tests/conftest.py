"""Shared test helpers: the repo root on sys.path, small request builders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Without a GPU, Triton kernels run under its interpreter. NOTE: this must be set
# before triton is first imported; the kernel tests also check and re-run themselves
# in a subprocess when it was not.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover - torch is a dependency
    pass

# CI runs property tests with a fixed seed sequence, so a landing is never decided by a
# lucky draw; locally each run explores new examples.
try:
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Unit tests never time anything: with pytest-benchmark loaded, a ``benchmark``
    fixture runs its function once (``--benchmark-disable``) unless the command line
    asks for timing (``--benchmark-enable`` / ``--benchmark-only``). Set here rather
    than in ``addopts`` so that pytest runs where the plugin is not installed; this
    hook runs before the plugin's own ``pytest_configure`` reads the option."""
    if not config.pluginmanager.hasplugin("benchmark"):
        return
    if not (config.getoption("benchmark_enable") or config.getoption("benchmark_only")):
        config.option.benchmark_disable = True
