"""The typed schema of the config specs, on pydantic: field types that say what they take,
and ``build_spec``, which checks a whole spec (types, ranges, unknown and missing keys,
nested specs) in one pass and turns pydantic's ``ValidationError`` into the project's
one-line ``ConfigError`` naming the key path (``engine.cost.step_overhead_s: must be a
number >= 0, got 'abc'``).

A spec is a frozen dataclass (``@spec``) that pydantic validates: its fields are typed with
the aliases below (``PositiveInt``, ``Fraction``, ``Flag``...) or ``Annotated`` with
``Says``, the words its message uses; rules between fields are
``@model_validator(mode="after")`` methods that raise ``SpecProblem(key, message)``. The
config is checked once, at the edge (``build_spec``); a spec the code builds or
``dataclasses.replace``-s is not checked again (nor slowed down). Booleans are real booleans ('no' is not false),
integers are not booleans, numbers are finite and stay as given (an int stays an int).
Imports nothing of the project but ``harness.errors`` (every room's specs may use it).
How to add a key: docs/config.md.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Annotated, Any, Mapping

from pydantic import ConfigDict, Field, Strict, TypeAdapter, ValidationError, WrapValidator

from harness.errors import ConfigError, did_you_mean


@dataclasses.dataclass(frozen=True)
class Says:
    """What a field's message says it must be (``must be {what}, got {value!r}``):
    ``or_null`` for a field that may be null (default ``{what} or null``), ``hint`` after it,
    ``got=False`` for a message without the value, ``after`` after the value."""

    what: str
    hint: str = ""
    got: bool = True
    or_null: str | None = None
    after: str = ""


class SpecProblem(ValueError):
    """A rule between a spec's fields is broken: ``key`` (relative to the spec; "" for the
    field whose validator raises it) and why."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def keep_int(value: Any, handler: Any) -> Any:
    """A float field given an int keeps the int (``memory_gib: 80`` is reported as 80)."""
    checked = handler(value)
    return value if type(value) is int else checked


PositiveInt = Annotated[int, Strict(), Field(gt=0), Says("a positive integer")]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0), Says("a non-negative integer")]
Number = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False), WrapValidator(keep_int),
                   Says("a number >= 0")]
PositiveNumber = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False),
                           WrapValidator(keep_int), Says("a positive number")]
Fraction = Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False),
                     WrapValidator(keep_int), Says("a number in (0, 1]")]
Flag = Annotated[bool, Strict(), Says("true or false", or_null="true, false or null")]
Name = Annotated[str, Strict(), Field(min_length=1), Says("a non-empty string")]


def one_of(values: typing.Iterable[str], says: Says | None = None) -> Any:
    """A field that takes one of ``values`` (its message: ``says``, or "one of a, b, c")."""
    values = tuple(values)
    return Annotated[typing.Literal[values], says or Says(f"one of {', '.join(values)}")]


def spec(cls: type) -> type:
    """A config spec: a frozen dataclass whose schema (``build_spec``) refuses unknown keys;
    ``validate(where)`` checks one built in code against it."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    cls.__pydantic_config__ = ConfigDict(extra="forbid")
    cls.validate = _validate
    return cls


def _validate(self: Any, where: str) -> None:
    """``ConfigError`` naming the key under ``where`` when this spec (built in code, e.g.
    ``EngineSpec(device="tpu")``) breaks its schema."""
    build_spec(type(self), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
               where)


def to_plain(node: Any) -> Any:
    """An OmegaConf node (or plain value) as plain dicts/lists."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def build_spec(cls: type, node: Mapping[str, Any] | None, where: str, **extra: Any):
    """Spec ``cls`` from a mapping (or an OmegaConf node), every key checked; a
    ``ConfigError`` naming the first key at fault under ``where`` (``engine``, ``model``)."""
    data = dict(to_plain(node) or {})
    data.update(extra)
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as exc:
        raise ConfigError(_message(cls, where, data, exc.errors())) from None


def check_value(kind: Any, value: Any, where: str) -> Any:
    """``value`` checked against one field type (``PositiveInt``, an ``Annotated`` with its
    ``Says``); a ``ConfigError`` naming ``where`` when it does not fit."""
    try:
        return _adapter(kind).validate_python(value)
    except ValidationError as exc:
        raise ConfigError(_message(kind, where, value, exc.errors())) from None


@functools.lru_cache(maxsize=None)
def _adapter(cls: Any) -> TypeAdapter:
    return TypeAdapter(cls)


def _first(errors: list[dict]) -> dict:
    """The error to report: an unknown key (the shallowest, then by name), a missing key,
    or else the first pydantic found (fields in order)."""
    unknown = [e for e in errors if e["type"] == "unexpected_keyword_argument"]
    if unknown:
        return min(unknown, key=lambda e: (len(e["loc"]), str(e["loc"][-1])))
    missing = [e for e in errors if e["type"] == "missing"]  # (in field order)
    return min(missing, key=lambda e: len(e["loc"])) if missing else errors[0]


def _message(cls: Any, where: str, data: Any, errors: list[dict]) -> str:
    error = _first(errors)
    owner, path, hint, value = _spec_class(cls), where, cls, data
    for part in error["loc"]:
        if not isinstance(part, str) or owner is None:
            break  # an item of a list field: the field's message names it
        path = f"{path}.{part}" if path else part
        hint = _hints(owner).get(part)
        value = value.get(part) if isinstance(value, Mapping) else None
        owner = _spec_class(hint)
    kind, given = error["type"], error["input"]
    if kind == "unexpected_keyword_argument":
        parent, _, key = path.rpartition(".")
        names = [f.name for f in dataclasses.fields(_owner_of(cls, error["loc"]))]
        return (f"{path}: unknown key.{did_you_mean(key, names)} Valid keys for {parent}: "
                f"{', '.join(names)}")
    if kind == "missing":
        return f"{path}: missing value; set {path}=..."
    if kind == "value_error" and isinstance(error.get("ctx", {}).get("error"), SpecProblem):
        problem = error["ctx"]["error"]
        key = ".".join(part for part in (path, problem.key) if part)
        return f"{key}: {problem.message}"
    if kind in ("dataclass_type", "dataclass_args_type") and owner is not None:
        keys = ", ".join(f.name for f in dataclasses.fields(owner))
        return f"{path}: must be a mapping of {owner.__name__} keys ({keys}), got {given!r}"
    says, optional = _says(hint)
    if says is None:
        return f"{path}: {error['msg']}, got {value!r}"
    what = (says.or_null or f"{says.what} or null") if optional else says.what
    must = f"must be {what}{says.hint}"
    if kind == "finite_number":
        return f"{path}: {must}; got {value!r}, which is not finite"
    if kind == "less_than_equal" and isinstance(value, int) and "le" in error.get("ctx", {}):
        return f"{path}: must be at most {error['ctx']['le']:,}{says.hint}, got {value:,}"
    return f"{path}: {must}, got {value!r}{says.after}" if says.got else f"{path}: {must}"


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """(the type of a field, whether it may be null)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) else ()
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else hint), True
    return hint, False


_UnionType = type(int | None)


def _spec_class(hint: Any) -> type | None:
    base, _ = _unwrap(hint)
    return base if isinstance(base, type) and dataclasses.is_dataclass(base) else None


def _says(hint: Any) -> tuple[Says | None, bool]:
    base, optional = _unwrap(hint)
    found = [m for m in getattr(base, "__metadata__", ()) if isinstance(m, Says)]
    return (found[-1] if found else None), optional


def _owner_of(cls: type, loc: tuple) -> type:
    """The spec class that holds the key at ``loc``."""
    for part in loc[:-1]:
        cls = _spec_class(_hints(cls).get(part)) or cls
    return cls
