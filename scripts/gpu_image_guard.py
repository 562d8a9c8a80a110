"""Rehearsal only: make this Python look like the H200 image to pagebench's imports.

The image has no hydra-core, omegaconf, antlr4-python3-runtime nor Hydra plugins; they
must come from the wheels gpu_check.sh installs into ``$GPU_PYDEPS``. A rehearsal venv
that sees the CI machine's site-packages (``--system-site-packages``, so that torch and
the rest need not be installed again) loads this module from a ``.pth`` file: imports of
those packages are then served from ``$GPU_PYDEPS`` only, and fail as on the image when
they are not there.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

HIDDEN = {"hydra", "omegaconf", "antlr4", "hydra_plugins"}


class ImageGuard:
    """A meta-path finder: top-level HIDDEN packages only from $GPU_PYDEPS."""

    def find_spec(self, name, path=None, target=None):
        if "." in name or name not in HIDDEN:
            return None
        folder = os.environ.get("GPU_PYDEPS")
        spec = importlib.machinery.PathFinder.find_spec(name, [folder]) if folder else None
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the H200 image: install the "
                                      "carried wheels, scripts/gpu_wheels.sh)", name=name)
        return spec


if not any(isinstance(f, ImageGuard) for f in sys.meta_path):
    sys.meta_path.insert(0, ImageGuard())
