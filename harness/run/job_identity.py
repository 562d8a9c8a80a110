"""A job's identity: the hash of its resolved config and of the files the run reads.

``config_hash`` hashes the resolved config and the content of these
files, so that a run whose input file was edited is another job (not "already done", not
reused by a sweep's other jobs: ``harness.run.reuse``). The config names files under a
few keys, at any depth (``FILE_KEYS``); each is resolved where its loader resolves it:

- ``path``: a trace (``workload.path``, a mixture's components, ``workload.trace.path``) or
  a model checkpoint (``model.path``: a directory, whose ``config.json`` and weights index
  the run reads, or the config.json itself);
- ``kernel_profile`` / ``host_profile``: a profile name (``conf/<group>/<name>.yaml``) or a
  path, and the ``kernel_results.json`` a ``source: kernel_results`` profile reads;
- ``kernel_results``: the kernel benchmark's rows.

NOTE: an explicit list of keys, not "every string that names an existing file": a
checkpoint directory's files and a profile's name resolve only as their loaders resolve
them, and a value such as ``systems=[paged]`` must not follow a file of that name in the
current directory. Files under ``conf/`` are left out: they are the program's own, versioned
with its code like the simulator (the resolved config already carries their selection), so
a default run's hash stays what it was.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from harness.config.conf_tree import CONF_DIR
from harness.errors import InputError
from harness.fileio import launch_path
from harness.results_format import DISPLAY_ONLY_KEYS
from harness.run.results import file_sha256

# Config keys whose string values name files a run reads.
FILE_KEYS = ("path", "kernel_profile", "host_profile", "kernel_results")
# What a run reads in a checkpoint directory (``model.path=DIR``), when it is there.
CHECKPOINT_FILES = ("config.json", "model.safetensors.index.json")


def input_files(node: Any) -> list[tuple[str, Path]]:
    """(label, file) of every file the plain config ``node`` names under ``FILE_KEYS``, at
    any depth, in config order; the label is the value as given (a trace's path) or the
    file's path (a checkpoint's or a profile's files)."""
    found: list[tuple[str, Path]] = []
    if isinstance(node, list):
        for item in node:
            found += input_files(item)
    if not isinstance(node, dict):
        return found
    for key, value in node.items():
        if key in FILE_KEYS and isinstance(value, str):
            found += [pair for pair in _named_files(key, value, node) if not _in_conf(pair[1])]
        else:
            found += input_files(value)
    return found


def _named_files(key: str, value: str, node: dict) -> list[tuple[str, Path]]:
    if key in ("kernel_profile", "host_profile"):
        from harness.engine.cost_profiles import profile_files

        results = node.get("kernel_results") if key == "kernel_profile" else None
        files = profile_files(value, key, results if isinstance(results, str) else None)
        return [(str(file), file) for file in files]
    path = launch_path(value)
    if path.is_file():
        return [(os.path.expanduser(value), path)]
    if key == "path" and path.is_dir():  # a checkpoint directory
        return [(str(path / name), path / name) for name in CHECKPOINT_FILES
                if (path / name).is_file()]
    return []


def _in_conf(path: Path) -> bool:
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(CONF_DIR))
    except OSError:
        return False


@functools.lru_cache(maxsize=64)
def _input_sha256(path: str, size: int, mtime_ns: int) -> str:
    """``file_sha256``, read once per file version (path, size, mtime) in a process."""
    return file_sha256(path)


def config_hash(cfg: Any) -> str:
    """sha256 of the resolved config (minus display-only keys) and of the content of the
    files it reads (``input_files``: an edited trace, profile or checkpoint
    config is another job): the identity of a job.

    A re-run of a sweep skips a job whose run directory already holds complete
    results with the same hash (see ``existing_complete_results``).
    """
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - hydra-core is a dependency
        pass
    plain = {k: v for k, v in dict(cfg).items() if k not in DISPLAY_ONLY_KEYS}
    inputs = {}
    for label, path in input_files(plain):
        try:
            stat = os.stat(path)
            inputs[label] = _input_sha256(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
        except OSError as exc:  # unreadable: say so here, before any loader opens it
            raise InputError(f"cannot read it: {exc.strerror or exc}", path=str(path)) from None
    if inputs:
        plain["__input_sha256__"] = inputs
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
