"""What a composition of ``conf/`` can hold, read from its YAML files (no Hydra).

``option_trees`` gives each config group option's nested tree (with what its own
defaults select), ``config_tree`` the top-level config's, ``option_selects`` which
options an option selects in other groups, and ``default_options`` what the top-level
config selects. ``harness.config.override_check`` looks command-line keys up in them before
Hydra composes anything.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import yaml

import harness

CONF_DIR = harness.CONF_DIR
GLOBAL_PACKAGE = "# @package _global_"
# NOTE: every run reads every file of conf/ here: with libyaml (when PyYAML has it) that
# takes ~20 ms instead of ~150 ms
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load(text: str):
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader


@dataclasses.dataclass(frozen=True)
class _File:
    group: tuple[str, ...]  # () for config.yaml
    option: str
    is_global: bool  # "# @package _global_"
    body: dict  # without its defaults list
    defaults: tuple


@lru_cache(maxsize=None)
def _files(conf_dir: Path) -> tuple[_File, ...]:
    """Every YAML file of ``conf_dir`` but Hydra's own (``conf/hydra/``)."""
    files = []
    for path in sorted(conf_dir.rglob("*.yaml")):
        group = path.parent.relative_to(conf_dir).parts
        if group[:1] == ("hydra",):
            continue  # Hydra's own nodes: Hydra checks them
        text = path.read_text()
        body = _load(text) or {}
        if not isinstance(body, dict):
            continue
        defaults = body.pop("defaults", None) or ()
        files.append(_File(group, path.stem, text.lstrip().startswith(GLOBAL_PACKAGE), body,
                           tuple(defaults) if isinstance(defaults, list) else ()))
    return tuple(files)


def _merge(base: dict, top: dict, union: bool = False) -> dict:
    """``top`` merged over a copy of ``base`` (mappings merged key by key). A value of
    ``top`` replaces one of ``base``, as Hydra composes; with ``union``, a mapping is
    never replaced by a plain value (every key either ever held is kept)."""
    out = dict(base)
    for key, value in top.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = _merge(old, value, union)
        elif not (union and isinstance(old, dict)):
            out[key] = value
    return out


def _nest(path: list[str], node: Any) -> dict:
    for key in reversed(path):
        node = {key: node}
    return node


def _default_entries(file: _File) -> Iterator[tuple[str, str | None, str, bool]]:
    """(group, package or None, option, is an ``override``) of each ``group: option`` entry
    of the file's defaults list."""
    for entry in file.defaults:
        if not isinstance(entry, dict):
            continue
        for key, option in entry.items():
            if not isinstance(key, str) or not isinstance(option, str):
                continue
            override = key.startswith("override ")
            key = key.removeprefix("override ").strip()
            group, _, package = key.partition("@")
            if group.startswith("/") or not file.group:
                group = group.lstrip("/")
            else:
                group = "/".join((*file.group, group))
            yield group, package or None, option, override


@lru_cache(maxsize=None)
def option_trees(conf_dir: Path = CONF_DIR) -> dict[str, dict[str, dict]]:
    """For each config group (``experiment`` aside), the node each option composes, as
    nested dicts, those of the options it extends (its defaults list names them) included."""
    found: dict[str, dict[str, tuple[dict, list[str]]]] = {}
    for file in _files(conf_dir):
        if len(file.group) != 1 or file.group[0] == "experiment":
            continue
        group = file.group[0]
        body = file.body
        if file.is_global:
            node = body.get(group)
            body = node if isinstance(node, dict) else {}
        bases = [entry for entry in file.defaults if isinstance(entry, str) and entry != "_self_"]
        found.setdefault(group, {})[file.option] = (body, bases)

    def tree_of(group: str, option: str, seen: frozenset[str]) -> dict:
        own, bases = found[group][option]
        tree: dict = {}
        for base in bases:
            if base in found[group] and base not in seen:
                tree = _merge(tree, tree_of(group, base, seen | {option}))
        return _merge(tree, own)

    return {group: {option: tree_of(group, option, frozenset()) for option in options}
            for group, options in found.items()}


@lru_cache(maxsize=None)
def option_keys(conf_dir: Path = CONF_DIR) -> dict[str, dict[str, frozenset[str]]]:
    """For each config group (``experiment`` aside), the keys each option's node holds,
    those of the options it extends (its defaults list names them) included."""
    return {group: {option: frozenset(tree) for option, tree in options.items()}
            for group, options in option_trees(conf_dir).items()}


@lru_cache(maxsize=None)
def option_selects(conf_dir: Path = CONF_DIR) -> dict[str, dict[str, dict[str, str]]]:
    """For each group's option, the options of other groups its defaults list selects
    (``workload=mooncake``: ``override /engine: sim_long_context``)."""
    selects: dict[str, dict[str, dict[str, str]]] = {}
    for file in _files(conf_dir):
        if len(file.group) != 1 or file.group[0] == "experiment":
            continue
        for group, package, option, _ in _default_entries(file):
            if package is None and group != file.group[0]:
                selects.setdefault(file.group[0], {}).setdefault(file.option, {})[group] = option
    return selects


@lru_cache(maxsize=None)
def config_tree(conf_dir: Path = CONF_DIR) -> dict:
    """Every key any composition of ``conf_dir`` can hold (Hydra's own aside), as nested
    dicts: config.yaml, every option of every group, experiments, and the options
    experiments place elsewhere (``/workload@study.workloads.sharegpt: sharegpt_like``)."""
    trees = option_trees(conf_dir)
    tree: dict = {}
    for file in _files(conf_dir):
        if not file.group or file.is_global:
            tree = _merge(tree, file.body, union=True)
        elif len(file.group) == 1 and file.group[0] in trees:
            tree = _merge(tree, {file.group[0]: trees[file.group[0]][file.option]}, union=True)
        else:
            tree = _merge(tree, _nest(list(file.group), file.body), union=True)
        for group, package, option, _ in _default_entries(file):
            if package is None or option not in trees.get(group, {}):
                continue
            package = package.removeprefix("_global_").lstrip(".")
            where = package.split(".") if file.is_global or not file.group else [
                *file.group, *package.split(".")]
            tree = _merge(tree, _nest([p for p in where if p], trees[group][option]), union=True)
    tree.pop("hydra", None)
    return tree


@lru_cache(maxsize=None)
def config_keys(conf_dir: Path = CONF_DIR) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The top-level keys any composition of ``conf_dir`` can hold (config groups included),
    and the keys each top-level node can hold."""
    tree = config_tree(conf_dir)
    top = {"hydra", *tree}
    top.update(directory.name for directory in conf_dir.iterdir() if directory.is_dir())
    return frozenset(top), {key: frozenset(value) for key, value in tree.items()
                            if isinstance(value, dict)}


@lru_cache(maxsize=None)
def config_body(conf_dir: Path) -> dict:
    """config.yaml, its defaults list included."""
    body = _load((conf_dir / "config.yaml").read_text()) or {}
    return body if isinstance(body, dict) else {}


@lru_cache(maxsize=None)
def default_options(conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """The option of each group that ``config.yaml``'s defaults list selects."""
    body = config_body(conf_dir)
    return {group: option for entry in body.get("defaults") or () if isinstance(entry, dict)
            for group, option in entry.items() if isinstance(option, str)}
