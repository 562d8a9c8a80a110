"""The kernel benchmark's sweep spec: head configs and ``KernelBenchSpec`` (validated).

The ``kernel_bench`` node of ``conf/experiment/kernels.yaml`` maps onto ``KernelBenchSpec``;
unknown keys and bad values raise ``harness.errors.ConfigError`` (a ``ValueError``) naming
the key (``kernel_bench.<key>``, ``kernel_bench.cpu.<key>`` for a CPU override) and how to
fix it, before anything is measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import InitVar, asdict, dataclass, field, fields
from pathlib import Path

import torch

from harness.errors import ConfigError, did_you_mean

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
BASELINES = ("reference", "sdpa", "flex")
DEVICES = ("auto", "cuda", "cpu")
BLOCK_ORDERS = ("random", "sequential")
# What the decode kernels accept (pagebench.kernels.paged_decode.validate_decode_common): refused here,
# before the sweep, instead of as an error on every measured point.
MAX_HEAD_DIM = 256
NUM_SPLITS_RANGE = (1, 1024)
TILE_SIZE_RANGE = (16, 256)  # a power of two
NUM_STAGES_RANGE = (1, 8)
MIN_COPY_BYTES = 1 << 10
_MODEL_DIMS = ("hidden_size", "intermediate_size", "num_layers")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _is_pow2(value: int) -> bool:
    return value > 0 and not value & (value - 1)


@dataclass(frozen=True)
class HeadConfig:
    """Attention heads of a model, plus the dims the end-to-end share needs (optional)."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_layers: int | None = None
    mlp: str = "gated"
    where: InitVar[str] = "kernel_bench.head_configs"  # how errors name this entry's list

    def __post_init__(self, where: str) -> None:
        if not (isinstance(self.name, str) and self.name.strip()):
            raise ConfigError(f"{where}[].name must be a non-empty string, got {self.name!r}")
        at = f"{where}[{self.name}]"
        for key in ("num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, key)
            if not (_is_int(value) and value > 0):
                raise ConfigError(f"{at}.{key} must be a positive int, got {value!r}")
        if self.head_dim > MAX_HEAD_DIM:
            raise ConfigError(f"{at}.head_dim must be at most {MAX_HEAD_DIM} (the decode kernels' "
                              f"limit), got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{at}: num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                              f"({self.num_kv_heads})")
        for key in _MODEL_DIMS:
            value = getattr(self, key)
            if value is not None and not (_is_int(value) and value > 0):
                raise ConfigError(f"{at}.{key} must be a positive int or null, got {value!r}")
        given = [key for key in _MODEL_DIMS if getattr(self, key) is not None]
        if given and len(given) < len(_MODEL_DIMS):
            missing = [key for key in _MODEL_DIMS if key not in given]
            raise ConfigError(f"{at}: {', '.join(given)} set without {', '.join(missing)}; the "
                              f"end-to-end share needs all of {', '.join(_MODEL_DIMS)} (or none)")
        if self.mlp not in ("gated", "gelu"):
            raise ConfigError(f"{at}.mlp must be 'gated' or 'gelu', got {self.mlp!r}")

    @property
    def has_model_dims(self) -> bool:
        return None not in (self.hidden_size, self.intermediate_size, self.num_layers)

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of one layer's matmuls: QKV, O, MLP in (gate+up or fc1), MLP out."""
        h, i = self.hidden_size, self.intermediate_size
        qkv = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        mlp_in = 2 * i if self.mlp == "gated" else i
        return [(h, qkv), (self.num_heads * self.head_dim, h), (h, mlp_in), (i, h)]


@dataclass(frozen=True)
class KernelBenchSpec:
    """The sweep; ``cpu`` holds overrides applied when the run lands on a CPU."""

    batch_sizes: tuple[int, ...] = (1, 8, 32, 64)
    context_lens: tuple[int, ...] = (1024, 4096, 8192)
    block_sizes: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256)
    dtypes: tuple[str, ...] = ("float16",)
    head_configs: tuple[HeadConfig, ...] = (
        HeadConfig("llama-2-13b", 40, 40, 128, 5120, 13824, 40),
        HeadConfig("llama-3-8b", 32, 8, 128, 4096, 14336, 32),
    )
    baselines: tuple[str, ...] = BASELINES
    device: str = "auto"
    block_order: str = "random"
    num_splits: int | None = None
    tile_size: int | None = None
    num_stages: int | None = None
    flex_block_sizes: tuple[int, ...] | None = (16,)  # None: every point (one compile per shape)
    flex_batch_sizes: tuple[int, ...] | None = (32,)
    flex_context_lens: tuple[int, ...] | None = (4096,)
    reference_max_tokens: int = 1 << 20  # skip the (slow) torch reference above batch x context
    warmup_ms: int = 10
    rep_ms: int = 50
    cpu_repeats: int = 5
    cpu_threads: int | None = 1  # torch threads while timing on CPU (None: leave as is)
    copy_bytes: int = 1 << 30
    seed: int = 0
    time_budget_s: float | None = None  # stop starting new points after this long (results say truncated)
    repeat_min_batch: int | None = 8  # re-time paged at block 16 for batch >= this after the sweep (null: no repeat)
    cpu: Mapping | None = field(default=None, compare=False)
    where: InitVar[str] = "kernel_bench"  # how errors name this spec (kernel_bench.cpu: the overrides)

    def __post_init__(self, where: str) -> None:
        def fail(key: str, message: str) -> None:
            raise ConfigError(f"{where}.{key} {message}")

        def int_list(key: str, *, allow_none: bool = False) -> None:
            values = getattr(self, key)
            if values is None and allow_none:
                return
            if not (isinstance(values, (list, tuple)) and values and all(_is_int(v) and v > 0 for v in values)):
                fail(key, f"must be a non-empty list of positive ints{' or null' if allow_none else ''}, "
                          f"got {_show(values)}")

        def name_list(key: str, valid, *, allow_empty: bool) -> None:
            values = getattr(self, key)
            if not isinstance(values, (list, tuple)) or (not values and not allow_empty):
                fail(key, f"must be a {'' if allow_empty else 'non-empty '}list of names from "
                          f"{list(valid)}, got {_show(values)}")
            for value in values:
                if value not in valid:
                    hint = did_you_mean(value, valid) if isinstance(value, str) else ""
                    fail(key, f"must be from {list(valid)}, got {value!r}.{hint}".rstrip("."))

        def choice(key: str, valid) -> None:
            value = getattr(self, key)
            if value not in valid:
                hint = did_you_mean(value, valid) if isinstance(value, str) else ""
                fail(key, f"must be one of {', '.join(valid)}, got {value!r}.{hint}".rstrip("."))

        def int_in(key: str, lo: int, hi: int | None = None, *, allow_none: bool = False,
                   extra: str = "") -> None:
            value = getattr(self, key)
            if value is None and allow_none:
                return
            if not (_is_int(value) and value >= lo and (hi is None or value <= hi)):
                bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
                fail(key, f"must be an int {bound}{extra}{' or null' if allow_none else ''}, got {value!r}")

        for key in ("batch_sizes", "context_lens", "block_sizes"):
            int_list(key)
        if not all(_is_pow2(bs) and bs <= 256 for bs in self.block_sizes):
            fail("block_sizes", f"must be powers of two <= 256, got {_show(self.block_sizes)}")
        name_list("dtypes", tuple(DTYPES), allow_empty=False)
        heads = self.head_configs
        if not isinstance(heads, (list, tuple)) or not heads:
            fail("head_configs", f"must name at least one head config, got {_show(heads)}")
        if not all(isinstance(h, HeadConfig) for h in heads):
            fail("head_configs", "entries must be head configs (mappings with name, num_heads, "
                                 "num_kv_heads, head_dim)")
        names = [h.name for h in heads]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            fail("head_configs", f"names must be unique (the results are keyed by them), got "
                                 f"{duplicated[0]!r} more than once")
        name_list("baselines", BASELINES, allow_empty=True)
        choice("device", DEVICES)
        choice("block_order", BLOCK_ORDERS)
        int_in("num_splits", *NUM_SPLITS_RANGE, allow_none=True)
        if self.tile_size is not None and not (_is_int(self.tile_size) and _is_pow2(self.tile_size)
                                               and TILE_SIZE_RANGE[0] <= self.tile_size <= TILE_SIZE_RANGE[1]):
            fail("tile_size", f"must be a power of two in {TILE_SIZE_RANGE[0]}..{TILE_SIZE_RANGE[1]} or null, "
                              f"got {self.tile_size!r}")
        int_in("num_stages", *NUM_STAGES_RANGE, allow_none=True)
        for key in ("flex_block_sizes", "flex_batch_sizes", "flex_context_lens"):
            int_list(key, allow_none=True)
        int_in("reference_max_tokens", 0, extra=" (0: never time the reference)")
        if not (_is_number(self.warmup_ms) and self.warmup_ms >= 0):
            fail("warmup_ms", f"must be a number >= 0, got {self.warmup_ms!r}")
        if not (_is_number(self.rep_ms) and self.rep_ms > 0):
            fail("rep_ms", f"must be a number > 0, got {self.rep_ms!r}")
        int_in("cpu_repeats", 1)
        int_in("cpu_threads", 1, allow_none=True)
        int_in("copy_bytes", MIN_COPY_BYTES)
        int_in("seed", 0)
        int_in("repeat_min_batch", 1, allow_none=True)
        if self.time_budget_s is not None and not (_is_number(self.time_budget_s) and self.time_budget_s > 0):
            fail("time_budget_s", f"must be a number of seconds > 0 or null, got {self.time_budget_s!r}")
        if self.cpu is not None:
            if not isinstance(self.cpu, Mapping):
                fail("cpu", f"must be a mapping of overrides for CPU runs or null, got {_show(self.cpu)}")
            self._merged_with(self.cpu, f"{where}.cpu")  # a bad override is refused on a GPU too

    @classmethod
    def from_mapping(cls, spec: Mapping, where: str = "kernel_bench") -> KernelBenchSpec:
        raw = _plain(spec)
        if not isinstance(raw, dict):
            raise ConfigError(f"{where} must be a mapping, got {type(spec).__name__}")
        known = [f.name for f in fields(cls)]
        if where != "kernel_bench":  # the cpu overrides cannot nest another cpu node
            known.remove("cpu")
        unknown = sorted(set(raw) - set(known), key=str)
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}.{did_you_mean(str(unknown[0]), known)} "
                              f"Known keys: {', '.join(sorted(known))}")
        kwargs = {}
        for key, value in raw.items():
            if key == "head_configs":
                if not isinstance(value, (list, tuple)):
                    raise ConfigError(f"{where}.head_configs must be a list of head configs, got {_show(value)}")
                value = tuple(_head_config(h, f"{where}.head_configs") for h in value)
            elif isinstance(value, list):
                value = tuple(value)
            kwargs[key] = value
        return cls(**kwargs, where=where)

    def for_device(self, device: torch.device) -> KernelBenchSpec:
        """The spec with its ``cpu`` overrides applied when running on a CPU."""
        if device.type != "cpu" or not self.cpu:
            return self
        return self._merged_with(self.cpu, "kernel_bench.cpu")

    def _merged_with(self, overrides: Mapping, where: str) -> KernelBenchSpec:
        """This spec with ``overrides`` applied; their errors are named ``<where>.<key>``."""
        merged = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("cpu", "head_configs")}
        merged["head_configs"] = [asdict(h) for h in self.head_configs]
        return KernelBenchSpec.from_mapping({**merged, **_plain(overrides)}, where)


def _show(value) -> str:
    text = repr(_plain(value))
    return text if len(text) <= 80 else text[:77] + "..."


def _plain(obj):
    """OmegaConf containers and tuples to plain Python (dicts, lists)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            return OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency of the harness
        pass
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _head_config(raw, where: str = "kernel_bench.head_configs") -> HeadConfig:
    if isinstance(raw, HeadConfig):
        return raw
    raw = _plain(raw)
    known = [f.name for f in fields(HeadConfig)]
    required = ["name", "num_heads", "num_kv_heads", "head_dim"]
    usage = (f"needs {', '.join(required)} (optional: "
             f"{', '.join(k for k in known if k not in required)})")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: entry {_show(raw)} is not a mapping; each entry {usage}")
    label = f"{where}[{raw.get('name', '?')}]"
    unknown = sorted(set(raw) - set(known), key=str)
    if unknown:
        raise ConfigError(f"{label}: unknown key {unknown[0]!r}.{did_you_mean(str(unknown[0]), known)} "
                          f"An entry {usage}")
    missing = [k for k in required if k not in raw]
    if missing:
        raise ConfigError(f"{label}: missing {', '.join(missing)}; an entry {usage}")
    return HeadConfig(**raw, where=where)


def load_spec(path: Path) -> dict:
    """The ``kernel_bench`` node of a YAML file (a Hydra experiment file or a bare spec)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return cfg.get("kernel_bench", cfg)
