"""Rehearsal only: make this Python look like the H200 image to pagebench's imports.

The image has no hydra-core, omegaconf, antlr4-python3-runtime nor Hydra plugins; they
must come from the wheels gpu_check.sh installs into ``$GPU_PYDEPS``. Nor is pagebench
installed there: the repository is a plain copy, and ``harness`` / ``pagebench.*`` come from
the symlink folder ``$GPU_PKGS`` (gpu_common.sh ``make_importable``). A rehearsal venv that
sees the CI machine's site-packages (``--system-site-packages``, where CI installed the
project too) loads this module from a ``.pth`` file: imports of those packages are then
served from ``$GPU_PYDEPS`` / ``$GPU_PKGS`` only, and fail as on the image when they are
not there.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

HIDDEN = {"hydra": ("GPU_PYDEPS",), "omegaconf": ("GPU_PYDEPS",), "antlr4": ("GPU_PYDEPS",),
          "hydra_plugins": ("GPU_PKGS", "GPU_PYDEPS"),  # a namespace: the project's sweeper + plugin wheels
          "harness": ("GPU_PKGS",), "pagebench": ("GPU_PKGS",)}


class ImageGuard:
    """A meta-path finder: top-level HIDDEN packages only from the folders their variables name."""

    def find_spec(self, name, path=None, target=None):
        if "." in name or name not in HIDDEN:
            return None
        folders = [os.environ[v] for v in HIDDEN[name] if os.environ.get(v)]
        spec = importlib.machinery.PathFinder.find_spec(name, folders) if folders else None
        if spec is None:
            how = ("install the carried wheels, scripts/gpu_wheels.sh" if HIDDEN[name] == ("GPU_PYDEPS",)
                   else "the checkout is importable only through gpu_common.sh make_importable")
            raise ModuleNotFoundError(f"No module named {name!r} (not in the H200 image: {how})", name=name)
        return spec


if not any(isinstance(f, ImageGuard) for f in sys.meta_path):
    sys.meta_path.insert(0, ImageGuard())
