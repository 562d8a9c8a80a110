"""Shared test helpers: the repo root on sys.path, small request builders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
