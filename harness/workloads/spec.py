"""Typed, validated workload configs.

Every workload kind declares a frozen dataclass of its parameters. ``parse_spec``
builds it from the plain mapping Hydra composed, and turns every problem into a
``ConfigError`` that names the key (``workload.arrival.rate``), says what is
allowed, and how to fix it. Value checks live in each dataclass's
``__post_init__``; they raise ``FieldError`` with the key relative to that
dataclass, and ``parse_spec`` prefixes the full path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Union

import numpy as np

from harness.errors import ConfigError, did_you_mean

MISSING_VALUE = "???"  # OmegaConf's mark for a mandatory value


class FieldError(Exception):
    """A value check failed inside a spec dataclass; ``parse_spec`` adds the key path."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def to_plain(node: Any) -> Any:
    """An OmegaConf node (or a plain value) as plain dicts and lists; mandatory '???' kept as is."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - hydra-core is a dependency
        return node
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True, throw_on_missing=False)
    return node


def parse_spec(cls: type, data: Any, where: str):
    """Build frozen dataclass ``cls`` from ``data``, rejecting unknown keys and bad values."""
    data = to_plain(data)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of keys to values, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            raise ConfigError(
                f"{where}.{key}: unknown key.{did_you_mean(key, fields)} Allowed keys: "
                f"{', '.join(fields)}. "
                f"Remove it or fix its spelling.")
    hints = _type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = f"{where}.{name}"
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        value = data.get(name, dataclasses.MISSING)
        if value is dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            kwargs[name] = parse_spec(f.default_factory, {}, key)  # its errors name key.<field>
            continue
        if value is dataclasses.MISSING or value == MISSING_VALUE:
            if required or value == MISSING_VALUE:
                help_text = f.metadata.get("help", "")
                hint = f" ({help_text})" if help_text else ""
                raise ConfigError(f"{key} is required: set {key}=<value>{hint}")
            continue
        kwargs[name] = _coerce(value, hints[name], key)
    try:
        return cls(**kwargs)
    except FieldError as err:
        raise ConfigError(f"{where}.{err.key}: {err.message}") from None


@functools.lru_cache(maxsize=None)
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against type hint ``tp`` (a small subset of typing), converting ints to floats."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{key}: must not be null")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: invalid value {value!r}")
    if value is None:
        raise ConfigError(f"{key}: must not be null; give a value")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: must be one of {', '.join(map(str, allowed))}; got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: must be a list, e.g. {key}=[1,2]; got {value!r}")
        (item_tp, _) = typing.get_args(tp)
        return tuple(_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        return parse_spec(tp, value, key)
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: must be a mapping; got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false; got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}: must be an integer; got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ConfigError(f"{key}: must be a number; got {value!r}")
        if not math.isfinite(float(value)):
            raise ConfigError(f"{key}: must be finite; got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string; got {value!r}")
        return value
    raise TypeError(f"unsupported spec type {tp!r} for {key}")  # a bug in a spec, not user input


def check(cond: bool, key: str, message: str) -> None:
    """Raise ``FieldError(key, message)`` unless ``cond``."""
    if not cond:
        raise FieldError(key, message)


def check_positive(obj: Any, *keys: str, allow_none: bool = True) -> None:
    for key in keys:
        value = getattr(obj, key)
        if value is None and allow_none:
            continue
        check(value is not None and value > 0, key, f"must be > 0, got {value!r}")


# ---------------------------------------------------------------------------
# Specs shared by many kinds


@dataclass(frozen=True, kw_only=True)
class ArrivalSpec:
    """When requests arrive.

    ``poisson``: exponential gaps at ``rate`` requests/s. ``gamma``: gamma gaps with
    mean 1/rate and coefficient of variation ``cv`` (burstier than Poisson when cv > 1).
    ``offline``: everything at t=0. ``trace``: the trace's own timestamps, rebased to
    start at 0, optionally multiplied by ``time_scale`` (0.5 = twice as fast) or
    rescaled so the mean rate is ``target_rate``. ``rate`` is ignored by offline and
    trace, so ``workload.arrival.process=offline`` needs no other change; ``cv``,
    ``time_scale`` and ``target_rate`` belong to one process each (``ONLY_WITH``) and
    are refused with any other (set for a process that ignores them, they would
    silently change nothing). The shipped presets set them to null.
    """

    process: Literal["poisson", "gamma", "offline", "trace"] = "poisson"
    rate: float | None = None
    cv: float | None = None
    time_scale: float | None = None
    target_rate: float | None = None

    # The key -> the one process that uses it.
    ONLY_WITH: typing.ClassVar[dict[str, str]] = {
        "cv": "gamma", "time_scale": "trace", "target_rate": "trace"}

    def __post_init__(self) -> None:
        check_positive(self, "rate", "cv", "time_scale", "target_rate")
        for key, process in self.ONLY_WITH.items():
            check(getattr(self, key) is None or self.process == process, key,
                  f"is used only with process={process}, and this arrival process is "
                  f"{self.process}, which ignores it: remove it ({key}=null) or set "
                  f"process={process}")
        if self.process in ("poisson", "gamma"):
            check(self.rate is not None, "rate",
                  f"process={self.process} needs a rate in requests/s, e.g. workload.arrival.rate=2.0")
        if self.process == "gamma":
            check(self.cv is not None, "cv",
                  "process=gamma needs a coefficient of variation, e.g. workload.arrival.cv=2.0 (1.0 = Poisson)")
        if self.process == "trace":
            check(self.time_scale is None or self.target_rate is None, "target_rate",
                  "set either time_scale or target_rate, not both")


MAX_LENGTH = 1 << 31  # tokens: no length drawn or configured goes above this


@dataclass(frozen=True, kw_only=True)
class LengthDist:
    """A token-length distribution: lognormal with arithmetic ``mean`` and shape ``sigma``
    (sigma 0 = always round(mean)), rounded, then clipped to [min, max]."""

    mean: float
    sigma: float = 0.0
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        check(self.mean >= 1, "mean", f"must be >= 1 token, got {self.mean!r}")
        check(self.mean <= MAX_LENGTH, "mean", f"must be at most {MAX_LENGTH:,} tokens, got {self.mean!r}")
        check(self.sigma >= 0, "sigma", f"must be >= 0, got {self.sigma!r}")
        check(self.min >= 1, "min", f"must be >= 1, got {self.min!r}")
        check(self.max is None or self.max >= self.min, "max",
              f"must be >= min ({self.min}), got {self.max!r}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths as int64."""
        if self.sigma == 0:
            values = np.full(n, round(self.mean), dtype=np.float64)
        else:
            mu = math.log(self.mean) - self.sigma**2 / 2  # so that E[X] = mean
            values = np.rint(rng.lognormal(mu, self.sigma, size=n))
        # NOTE: a long lognormal tail would overflow int64: MAX_LENGTH bounds every draw (far
        # above any model's context: such a request is dropped or truncated like any other)
        hi = min(self.max, MAX_LENGTH) if self.max is not None else MAX_LENGTH
        return np.clip(values, self.min, hi).astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """Keys every workload kind accepts."""

    kind: str
    name: str = ""
    num_requests: int | None = None
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    clip: Literal["drop", "truncate"] = "drop"
    num_samples: int = 1
    beam_width: int = 1

    def __post_init__(self) -> None:
        check(self.num_requests is None or self.num_requests >= 1, "num_requests",
              f"must be >= 1 (or null for a whole trace), got {self.num_requests!r}")
        check(self.num_samples >= 1, "num_samples", f"must be >= 1, got {self.num_samples!r}")
        check(self.beam_width >= 1, "beam_width", f"must be >= 1, got {self.beam_width!r}")
        check(self.num_samples == 1 or self.beam_width == 1, "beam_width",
              "parallel sampling (num_samples > 1) and beam search (beam_width > 1) "
              "cannot be combined; set one of them to 1")


@dataclass(frozen=True, kw_only=True)
class SyntheticSpec(WorkloadSpec):
    """A generated workload: ``num_requests`` is required."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_requests is not None, "num_requests",
              "a synthetic workload needs a count, e.g. workload.num_requests=400")


@dataclass(frozen=True, kw_only=True)
class TraceSpec(WorkloadSpec):
    """A replayed file: path, format, error policy, time window and length filters."""

    path: str = field(metadata={"help": "the trace file, e.g. workload.path=/data/trace.csv"})
    format: Literal["auto", "csv", "jsonl", "json", "parquet"] = "auto"
    on_error: Literal["raise", "skip"] = "raise"
    start_s: float | None = None  # time window, seconds after the trace's first timestamp
    end_s: float | None = None
    min_input_len: int | None = None
    min_output_len: int | None = None
    max_input_len: int | None = None
    max_total_len: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.path), "path", "must be a file path, e.g. workload.path=/data/trace.csv")
        check(self.start_s is None or self.start_s >= 0, "start_s", f"must be >= 0, got {self.start_s!r}")
        check(self.end_s is None or self.end_s > (self.start_s or 0), "end_s",
              f"must be > start_s ({self.start_s or 0}), got {self.end_s!r}")
        check_positive(self, "min_input_len", "min_output_len", "max_input_len", "max_total_len")
