"""Command-line overrides the config cannot take, refused with a clear message.

Hydra refuses ``blok_size=16`` with "Could not override 'blok_size'. To append to your
config use +blok_size=16": the wrong fix for a typo. Before Hydra composes anything,
``check_overrides`` looks the key of every plain ``key=value`` override up in what a
composition of ``conf/`` can hold, at every depth (``block_size``,
``engine.max_num_seqs``, ``engine.cost.step_overhead_s``, ``workload.input.mean``),
and names the closest valid key instead. A key of a config group's node is checked
against the option the run selects (``workload=docqa``, or the default, or the option
another selected option picks: ``workload=mooncake`` selects ``engine=sim_long_context``),
unless an ``experiment`` may add keys to it (then against every key any composition can
hold): ``workload.input_column`` is a key of ``workload=table``, not of ``docqa``. A key
that a spec takes but the YAML does not set (``allocator.paged.block_size``,
``model.num_layers_override``) needs Hydra's ``+``: the message says so.

Deleting a key every run reads (``~seed``, ``~model``) is refused too. Adding (``+key``)
and package overrides, and runs with another config directory, are left to Hydra (an
added key of the wrong name is named after composing, by the specs).
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

from harness.config.conf_tree import (CONF_DIR, config_body, config_keys, config_tree, default_options,
                               option_selects, option_trees)
from harness.errors import did_you_mean
from harness.config.specs import REQUIRED_KEYS


def _parse(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - a syntax error: Hydra's message names it
        return None


def check_overrides(overrides: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The error message for the first override the run cannot take (a deleted key every
    run reads, a key no composition has), or None."""
    return refused_deletion(overrides, conf_dir) or unknown_override(overrides, conf_dir)


def refused_deletion(overrides: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The error message for ``~key`` of a key every run reads (``~seed``, ``~model``), or
    None: the run would stop on the missing key."""
    from hydra.core.override_parser.types import OverrideType

    parsed = _parse(overrides)
    if parsed is None:
        return None
    groups = option_trees(conf_dir)
    for override in parsed:
        key = override.key_or_group
        if override.type != OverrideType.DEL or override.package is not None or (
                key not in REQUIRED_KEYS):
            continue
        if key in groups:
            instead = f"select another option: {key}=<{' | '.join(sorted(groups[key]))}>"
        else:
            instead = f"set another value: {key}={_example(conf_dir, key)}"
        return (f"{key}: required (every run reads it), so it cannot be deleted; {instead} "
                f"(in {override.input_line!r})")
    return None


def _example(conf_dir: Path, key: str) -> str:
    value = config_body(conf_dir).get(key, "...")
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def unknown_override(overrides: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The error message for the first plain ``key=value`` override (sweeps included) whose
    key the run's composition cannot have, at any depth, or None (also when Hydra cannot
    parse them: it reports that itself)."""
    from hydra.core.override_parser.types import OverrideType

    parsed = _parse(overrides)
    if parsed is None:
        return None
    top, _ = config_keys(conf_dir)
    tree = config_tree(conf_dir)
    trees = option_trees(conf_dir)
    chosen: dict[str, list[str] | None] = dict.fromkeys([*trees, "experiment"])
    added: list[list[str]] = []  # +key=...: a later key=... may set it
    for override in parsed:
        key = override.key_or_group
        if override.type in (OverrideType.ADD, OverrideType.FORCE_ADD):
            added.append(key.split("."))
        if override.type != OverrideType.DEL and key in chosen and override.package is None:
            values = (list(override.sweep_string_iterator()) if override.is_sweep_override()
                      else [override.value()])
            chosen[key] = [str(value) for value in values]
    experiment = chosen["experiment"] not in (None, ["null"])
    selected = _selected_options(chosen, conf_dir)
    for override in parsed:
        if override.type != OverrideType.CHANGE or override.package is not None:
            continue
        key = override.key_or_group
        parts = key.split("/")[0].split(".")
        hint = f" (in {override.input_line!r}; python -m harness --help lists the config)"
        if parts[0] not in top:
            return (f"{parts[0]}: unknown top-level key.{did_you_mean(parts[0], top)} Valid keys: "
                    f"{', '.join(sorted(top - {'hydra'}))}{hint}")
        if ("/" in key or parts[0] == "hydra"  # Hydra checks its own
                or key in chosen or any(parts[:len(path)] == path for path in added)):
            continue
        group = parts[0]
        if group in trees and not experiment and selected.get(group):
            message = _check_options(group, selected[group], parts, override.input_line, conf_dir)
            nodes = [_node(trees[group][option], parts[1:]) for option in selected[group]]
        else:  # an experiment may add keys: any that some composition holds
            message = _check_tree(tree, parts)
            nodes = [_node(tree, parts)]
        if message:
            return message + hint
        if not override.is_sweep_override():
            if len(parts) == 1:  # config.yaml's own value is the example
                nodes.insert(0, config_body(conf_dir).get(key))
            message = _check_shape(key, nodes, override.value())
            if message:
                return f"{message} (in {override.input_line!r})"
    return None


def _node(tree: Any, path: list[str]) -> Any:
    """The value at ``path`` of ``tree`` (None where it has none)."""
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def _check_shape(key: str, nodes: list[Any], value: Any) -> str | None:
    """Hydra cannot merge a mapping into a list (``systems={a:paged}``) nor a list into a
    mapping: the message for such a value, or None."""
    if isinstance(value, dict) and any(isinstance(node, list) for node in nodes):
        example = next(node for node in nodes if isinstance(node, list))
        return (f"{key}: must be a list, e.g. {key}=[{','.join(map(str, example))}]; got a "
                f"mapping")
    if isinstance(value, list) and any(isinstance(node, dict) for node in nodes):
        keys = sorted({k for node in nodes if isinstance(node, dict) for k in node})
        return (f"{key}: must be a mapping of its keys ({', '.join(keys)}), e.g. "
                f"{key}.{keys[0] if keys else 'key'}=...; got a list")
    return None


def _selected_options(chosen: dict[str, list[str] | None], conf_dir: Path
                      ) -> dict[str, list[str] | None]:
    """The options each group's node may come from: chosen on the command line, else
    selected by another chosen option (``workload=mooncake`` selects its model, hardware
    and engine), else config.yaml's default. None where an option is unknown (Hydra names it)."""
    trees, defaults = option_trees(conf_dir), default_options(conf_dir)
    selects = option_selects(conf_dir)
    selected: dict[str, list[str] | None] = {}
    for group in trees:
        options = chosen.get(group) or ([defaults[group]] if group in defaults else None)
        selected[group] = options if options and all(o in trees[group] for o in options) else None
    implied: dict[str, set[str]] = {}
    for group, options in list(selected.items()):
        targets = [selects.get(group, {}).get(option, {}) for option in options or ()]
        for other in set().union(*targets):
            if chosen.get(other) is None and other in trees:
                implied.setdefault(other, set()).update(
                    target.get(other, defaults.get(other)) for target in targets)
    for group, options in implied.items():
        options.discard(None)
        selected[group] = sorted(options) if all(o in trees[group] for o in options) else None
    return selected


def _missing(tree: Any, path: list[str]) -> tuple[int, dict] | None:
    """(index of the first key of ``path`` that ``tree`` lacks, the mapping that lacks it),
    or None when it has them all or a value on the way is not a mapping (not for us to check)."""
    node = tree
    for i, key in enumerate(path):
        if not isinstance(node, dict):
            return None
        if key not in node:
            return i, node
        node = node[key]
    return None


def _has(tree: Any, path: list[str]) -> bool:
    node = tree
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _check_tree(tree: dict, parts: list[str]) -> str | None:
    found = _missing(tree, parts)
    if found is None:
        return None
    i, node = found
    return (f"{'.'.join(parts[:i + 1])}: unknown key.{did_you_mean(parts[i], node)} Valid keys"
            f"{'' if i == 0 else ' of ' + '.'.join(parts[:i])}: {', '.join(sorted(node))}")


def _check_options(group: str, options: list[str], parts: list[str], line: str,
                   conf_dir: Path) -> str | None:
    trees = option_trees(conf_dir)
    for option in options:
        found = _missing(trees[group][option], parts[1:])
        if found is None:
            continue
        i, node = found
        depth = i + 2  # parts[:depth] is the key the option lacks
        name, parent = parts[depth - 1], ".".join(parts[:depth - 1])
        owners = sorted(other for other, tree in trees[group].items()
                        if _has(tree, parts[1:depth]))
        addable = sorted(_spec_fields(group, trees[group][option], parts[1:depth - 1]) - set(node))
        missing = ".".join(parts[:depth])
        where = f"{group}={option}" if depth == 2 else f"{parent} ({group}={option})"
        suggestion = did_you_mean(name, {*node, *addable})
        if owners:
            what = (f"{group}={option} has no such key (it is a key of "
                    f"{group}={', '.join(owners)}).")
        elif name in addable:  # the spec takes it; Hydra needs a + to add it
            add = f"+{line}" if depth == len(parts) else f"+{missing}=..."
            what = f"{where} does not set it: add it with {add}"
            what += "" if add.endswith("...") else "."
            if group == "allocator" and name == "block_size":
                what = (f"{parent} does not set it (every paged system takes the top-level "
                        f"block_size: block_size={line.partition('=')[2]}); to set it for "
                        f"{parts[1]} alone, add it: {add}.")
            suggestion = ""
        else:
            what = "unknown key."
        listed = f" Keys of {where}: {', '.join(sorted(node))}"
        if addable:
            listed += f"; it also takes, added with +: {', '.join(addable)}"
        return f"{missing}: {what}{suggestion}{listed}"
    return None


def _spec_fields(group: str, tree: dict, path: list[str]) -> set[str]:
    """The keys the spec of ``group``'s node at ``path`` takes (e.g. ``SystemSpec`` for
    ``allocator.paged``), or an empty set where no spec is known."""
    from harness.config import specs as config

    specs: dict[tuple[str, ...], type] = {
        ("model",): config.ModelSpec, ("model", "rope_scaling"): config.RopeScaling,
        ("hardware",): config.HardwareSpec,
        ("hardware", "fitted"): config.FittedCostSpec, ("engine",): config.EngineSpec,
        ("engine", "cost"): config.CostSpec}
    cls = specs.get((group, *path))
    if group == "allocator" and len(path) == 1:
        cls = config.SystemSpec
    elif group == "workload" and isinstance(tree.get("kind"), str):
        try:
            from harness.workloads import KINDS
        except Exception:  # noqa: BLE001 - only a message's detail depends on it
            return set()
        kind = KINDS.get(tree["kind"])
        cls = kind.spec if kind is not None else None
        for key in path:
            cls = _field_class(cls, key)
    if cls is None or not dataclasses.is_dataclass(cls):
        return set()
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    if group == "allocator":
        fields.discard("name")  # the system's name is its key in the catalog
        fields.discard("options")  # select_systems fills it from the manager's declared keys
    return fields


def _field_class(cls: type | None, key: str) -> type | None:
    """The dataclass type of field ``key`` of dataclass ``cls`` (Optional unwrapped), or None."""
    if cls is None or not dataclasses.is_dataclass(cls):
        return None
    try:
        hint = typing.get_type_hints(cls).get(key)
    except Exception:  # noqa: BLE001
        return None
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def sweep_without_multirun(overrides: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The note for a command line without ``-m`` that selects an experiment which is a
    sweep (its YAML sets ``hydra.sweeper.params``): Hydra runs one job of it, silently."""
    import yaml

    for override in overrides:
        key, _, name = override.lstrip("+").partition("=")
        if key != "experiment" or not name or "," in name:
            continue
        try:
            data = yaml.safe_load((conf_dir / "experiment" / f"{name}.yaml").read_text())
            params = data["hydra"]["sweeper"]["params"]
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            continue
        if isinstance(params, dict) and params:
            swept = ", ".join(f"{k}={v}" for k, v in params.items())
            return (f"experiment={name} is a sweep ({swept}); without -m this runs one job, "
                    f"with the config's own values: add -m to run the sweep "
                    f"(python -m harness -m experiment={name})")
    return None
