"""Command-line overrides of keys the config cannot have, refused with a clear message.

Hydra refuses ``blok_size=16`` with "Could not override 'blok_size'. To append to your
config use +blok_size=16": the wrong fix for a typo. Before Hydra composes anything,
``unknown_override`` looks the key of every plain ``key=value`` override up in what any
composition of ``conf/`` can hold, and names the closest valid key instead.

It checks the first two levels only (``block_size``, ``engine.max_num_seqs``): deeper
nodes may be free-form (the allocator catalog's systems, a study's workloads). Adding
(``+key``), deleting (``~key``) and package overrides, and runs with another config
directory, are left to Hydra.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from harness.errors import did_you_mean

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
GLOBAL_PACKAGE = "# @package _global_"


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
        body = yaml.safe_load(text) or {}
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
    for override in parsed:
        if override.type != OverrideType.CHANGE or override.package is not None:
            continue
        key = override.key_or_group
        parts = key.split("/")[0].split(".")
        hint = f" (in {override.input_line!r}; python -m harness --help lists the config)"
        if parts[0] not in top:
            return (f"{parts[0]}: unknown top-level key.{did_you_mean(parts[0], top)} Valid keys: "
                    f"{', '.join(sorted(top - {'hydra'}))}{hint}")
        if len(parts) > 1 and "/" not in key and parts[0] in nested:
            valid = nested[parts[0]]
            if parts[1] not in valid:
                return (f"{parts[0]}.{parts[1]}: unknown key.{did_you_mean(parts[1], valid)} "
                        f"Valid keys: {', '.join(sorted(valid))}{hint}")
    return None
