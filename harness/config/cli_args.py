"""Argument types for the small command-line tools (``harness.tools.calibrate``, ``harness.tools.hostcost``),
and checks of top-level config values that several entry points share.

As ``type=`` of ``argparse`` arguments they turn a bad value into argparse's own
"error: argument --x: ..." and exit status 2, before anything is measured. ``check_seed``
raises the ``ConfigError`` that ``python -m harness`` prints (exit status 2) for a serving
run and a study alike; ``check_device``, one for a ``--device`` this machine lacks.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def check_seed(value: object, where: str = "seed") -> int:
    """The config's ``seed``: a non-negative integer (not a bool, a float or a string:
    ``seed=1.5`` would otherwise run as seed 1 while config_resolved.yaml says 1.5)."""
    from harness.spec_schema import NonNegativeInt, check_value

    return check_value(NonNegativeInt, value, where)


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0, e.g. ``--seed``."""
    return _int_at_least(text, 0)


def positive_ints(text: str) -> tuple[int, ...]:
    """A comma list of integers >= 1, e.g. ``1,8,32``."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or "" in items:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers such as 1,8,32, "
                                         f"got {text!r}")
    return tuple(positive_int(item) for item in items)


def output_file(text: str) -> Path:
    """A file path that can be written: not a directory, in a folder that exists (or is made
    now) and takes a new file. Checked before a long measurement, not after it."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a directory: name a file in it")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {path}: {folder} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(f"cannot write {path}: {err.strerror or err}") from None
    return path


def device_arg(text: str) -> str:
    """``--device`` (argparse ``type=``): auto, cpu, cuda or cuda:N, checked before anything runs."""
    value = text.strip()
    index = value[5:] if value.startswith("cuda:") else None
    if value in ("auto", "cpu", "cuda") or (index is not None and index.isascii() and index.isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N, got {text!r}")


def check_device(name: str) -> None:
    """A ConfigError naming ``--device`` when it asks for a GPU this machine does not have."""
    import torch

    from harness.errors import ConfigError

    if not name.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: no CUDA device is available; use --device cpu (or auto)")
    count = torch.cuda.device_count()
    if ":" in name and int(name.split(":", 1)[1]) >= count:
        raise ConfigError(f"--device {name}: this machine has {count} CUDA device(s) (cuda:0.."
                          f"cuda:{count - 1})")
