"""Typed checks for the config specs (``harness.config.specs`` and its spec modules).

``build_spec`` builds a frozen spec dataclass from a mapping, refusing unknown keys with a
``ConfigError`` that names the key; the ``_require*`` helpers are what each spec's
``validate`` uses. A spec module registers its nested specs (a field that is itself a
spec) in ``_NESTED``, so that this module imports none of them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from harness.errors import ConfigError, did_you_mean

# (spec class name, field) -> the spec class of that field's mapping; each spec module
# adds its own entries (harness/models/model_spec.py, harness/config/hardware_spec.py, harness/config/specs.py)
_NESTED: dict[tuple[str, str], type] = {}


def to_plain(node: Any) -> Any:
    """An OmegaConf node (or plain value) as plain dicts/lists."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(node, (DictConfig, ListConfig)):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return node


def build_spec(cls: type, node: Mapping[str, Any] | None, where: str, **extra: Any):
    """Construct frozen dataclass ``cls`` from a mapping, rejecting unknown keys."""
    data = dict(to_plain(node) or {})
    data.update(extra)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]}: unknown key.{did_you_mean(unknown[0], names)} Valid keys "
            f"for {where}: {', '.join(names)}"
        )
    for key, value in list(data.items()):
        sub = _NESTED.get((cls.__name__, key))
        if sub is not None and isinstance(value, Mapping):
            data[key] = build_spec(sub, value, f"{where}.{key}")
        elif sub is not None and not (value is None and _field_default(cls, key) is None):
            raise ConfigError(f"{where}.{key}: must be a mapping of {sub.__name__} keys "
                              f"({', '.join(f.name for f in dataclasses.fields(sub))}), got {value!r}")
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]  # type: ignore[misc]
    if missing:
        raise ConfigError(f"{where}.{missing[0]}: missing value; set {where}.{missing[0]}=...")
    obj = cls(**data)
    obj.validate(where)
    return obj


def _field_default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default


def _require(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {message}")


# Typed checks for the validate methods. YAML and Hydra overrides parse true/false as
# booleans, numbers as int/float and anything else (``no``, ``abc``) as a string, so each
# key's type is checked before its range: a string never reaches a comparison (a
# TypeError), a bool never passes for an integer (True == 1), and nan/inf (``1e400``,
# ``inf``) never reach arithmetic.

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_bool(spec: Any, where: str, *keys: str, optional: bool = False,
                  hint: str = "") -> None:
    """Each key is true or false (or null when ``optional``); strings such as 'no' are refused."""
    for key in keys:
        value = getattr(spec, key)
        if value is None and optional:
            continue
        _require(isinstance(value, bool), f"{where}.{key}",
                 f"must be {'true, false or null' if optional else 'true or false'}{hint}, "
                 f"got {value!r}")


def _require_int(spec: Any, where: str, *keys: str, optional: bool = False,
                 maximum: int | None = None, hint: str = "") -> None:
    """Each key is a positive integer (not a bool), at most ``maximum`` (or null when ``optional``)."""
    for key in keys:
        value = getattr(spec, key)
        if value is None and optional:
            continue
        _require(_is_int(value) and value > 0, f"{where}.{key}",
                 f"must be a positive integer{' or null' if optional else ''}{hint}, got {value!r}")
        if maximum is not None:
            _require(value <= maximum, f"{where}.{key}",
                     f"must be at most {maximum:,}{hint}, got {value:,}")


# Ranges for _require_number: (what the message says, the test)
NON_NEGATIVE = ("a number >= 0", lambda v: v >= 0)
POSITIVE = ("a positive number", lambda v: v > 0)
FRACTION = ("a number in (0, 1]", lambda v: 0 < v <= 1)


def _require_number(spec: Any, where: str, *keys: str, rule: tuple = NON_NEGATIVE,
                    optional: bool = False, hint: str = "") -> None:
    """Each key is a finite int or float (not a bool, not a string) within ``rule``."""
    what, ok = rule
    for key in keys:
        value = getattr(spec, key)
        if value is None and optional:
            continue
        must = f"must be {what}{' or null' if optional else ''}{hint}"
        _require(isinstance(value, (int, float)) and not isinstance(value, bool),
                 f"{where}.{key}", f"{must}, got {value!r}")
        _require(math.isfinite(value), f"{where}.{key}", f"{must}; got {value!r}, which is not finite")
        _require(ok(value), f"{where}.{key}", f"{must}, got {value!r}")


def _require_str(spec: Any, where: str, *keys: str) -> None:
    for key in keys:
        value = getattr(spec, key)
        _require(isinstance(value, str) and value != "", f"{where}.{key}",
                 f"must be a non-empty string, got {value!r}")

