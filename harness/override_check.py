"""Command-line overrides of keys the config cannot have, refused with a clear message.

Hydra refuses ``blok_size=16`` with "Could not override 'blok_size'. To append to your
config use +blok_size=16": the wrong fix for a typo. Before Hydra composes anything,
``unknown_override`` looks the key of every plain ``key=value`` override up in what any
composition of ``conf/`` can hold, and names the closest valid key instead.

It checks the first two levels only (``block_size``, ``engine.max_num_seqs``): deeper
nodes may be free-form (the allocator catalog's systems, a study's workloads). A key of a
config group's node is checked against the option the run selects (``workload=docqa``,
or the default), unless an ``experiment`` may add keys to it: ``workload.input_column``
is a key of ``workload=table``, not of ``docqa``. Adding (``+key``), deleting (``~key``)
and package overrides, and runs with another config directory, are left to Hydra.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from harness.errors import did_you_mean

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
GLOBAL_PACKAGE = "# @package _global_"
# NOTE: every run reads every file of conf/ here: with libyaml (when PyYAML has it) that
# takes ~20 ms instead of ~150 ms
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load(text: str):
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader


@lru_cache(maxsize=None)
def config_keys(conf_dir: Path = CONF_DIR) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The top-level keys any composition of ``conf_dir`` can hold (config groups included),
    and the keys each top-level node can hold, from every YAML file there."""
    top: set[str] = {"hydra"}
    nested: dict[str, set[str]] = {}
    for path in sorted(conf_dir.rglob("*.yaml")):
        group = path.parent.relative_to(conf_dir).parts
        if group[:1] == ("hydra",):
            continue  # Hydra's own nodes: Hydra checks them
        text = path.read_text()
        body = _load(text) or {}
        if not isinstance(body, dict):
            continue
        body.pop("defaults", None)
        if group and not text.lstrip().startswith(GLOBAL_PACKAGE):
            top.add(group[0])
            body = {group[0]: body}  # a group's option is that group's node
        for key, value in body.items():
            top.add(key)
            if isinstance(value, dict) and key != "hydra":
                nested.setdefault(key, set()).update(value)
    for directory in conf_dir.iterdir():  # groups (e.g. experiment) may be selected bare
        if directory.is_dir():
            top.add(directory.name)
    return frozenset(top), {key: frozenset(keys) for key, keys in nested.items()}


@lru_cache(maxsize=None)
def option_keys(conf_dir: Path = CONF_DIR) -> dict[str, dict[str, frozenset[str]]]:
    """For each config group (``experiment`` aside), the keys each option's node holds,
    those of the options it extends (its defaults list names them) included."""
    found: dict[str, dict[str, tuple[set[str], list[str]]]] = {}
    for path in sorted(conf_dir.glob("*/*.yaml")):
        group = path.parent.name
        if group in ("hydra", "experiment"):
            continue
        text = path.read_text()
        body = _load(text) or {}
        if not isinstance(body, dict):
            continue
        bases = [entry for entry in body.pop("defaults", None) or ()
                 if isinstance(entry, str) and entry != "_self_"]
        if text.lstrip().startswith(GLOBAL_PACKAGE):
            node = body.get(group)
            body = node if isinstance(node, dict) else {}
        found.setdefault(group, {})[path.stem] = (set(body), bases)

    def keys_of(group: str, option: str, seen: frozenset[str]) -> set[str]:
        own, bases = found[group][option]
        keys = set(own)
        for base in bases:
            if base in found[group] and base not in seen:
                keys |= keys_of(group, base, seen | {option})
        return keys

    return {group: {option: frozenset(keys_of(group, option, frozenset())) for option in options}
            for group, options in found.items()}


@lru_cache(maxsize=None)
def default_options(conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """The option of each group that ``config.yaml``'s defaults list selects."""
    body = _load((conf_dir / "config.yaml").read_text()) or {}
    return {group: option for entry in body.get("defaults") or () if isinstance(entry, dict)
            for group, option in entry.items() if isinstance(option, str)}


def unknown_override(overrides: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The error message for the first plain ``key=value`` override (sweeps included) whose
    key no composition of ``conf_dir`` has, or None (also when Hydra cannot parse them:
    it reports that itself)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - a syntax error: Hydra's message names it
        return None
    top, nested = config_keys(conf_dir)
    groups = option_keys(conf_dir)
    chosen = dict.fromkeys(groups)  # group -> the options the run selects (None: the default)
    for override in parsed:
        if override.type == OverrideType.CHANGE and override.key_or_group in (*groups, "experiment"):
            values = (list(override.sweep_string_iterator()) if override.is_sweep_override()
                      else [override.value()])
            chosen[override.key_or_group] = [str(value) for value in values]
    for override in parsed:
        if override.type != OverrideType.CHANGE or override.package is not None:
            continue
        key = override.key_or_group
        parts = key.split("/")[0].split(".")
        hint = f" (in {override.input_line!r}; python -m harness --help lists the config)"
        if parts[0] not in top:
            return (f"{parts[0]}: unknown top-level key.{did_you_mean(parts[0], top)} Valid keys: "
                    f"{', '.join(sorted(top - {'hydra'}))}{hint}")
        if len(parts) < 2 or "/" in key or parts[0] not in nested:
            continue
        group, sub = parts[0], parts[1]
        options = groups.get(group, {})
        selected = chosen.get(group) or [default_options(conf_dir).get(group)]
        if chosen.get("experiment") in (None, ["null"]) and all(o in options for o in selected):
            for option in selected:  # NOTE: an experiment may add keys to the group's node
                keys = options[option]
                if sub in keys:
                    continue
                owners = sorted(name for name, other in options.items() if sub in other)
                what = (f"{group}={option} has no such key (it is a key of "
                        f"{group}={', '.join(owners)})." if owners else "unknown key.")
                return (f"{group}.{sub}: {what}{did_you_mean(sub, keys)} Keys of "
                        f"{group}={option}: {', '.join(sorted(keys))}{hint}")
        elif sub not in nested[group]:
            valid = nested[group]
            return (f"{group}.{sub}: unknown key.{did_you_mean(sub, valid)} "
                    f"Valid keys: {', '.join(sorted(valid))}{hint}")
    return None
