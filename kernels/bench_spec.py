"""The kernel benchmark's sweep spec: head configs and ``KernelBenchSpec`` (validated).

The ``kernel_bench`` node of ``conf/experiment/kernels.yaml`` maps onto ``KernelBenchSpec``;
unknown keys and bad values raise ``ValueError`` naming the key and how to fix it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
BASELINES = ("reference", "sdpa", "flex")


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

    def __post_init__(self) -> None:
        for key in ("num_heads", "num_kv_heads", "head_dim"):
            if not (isinstance(getattr(self, key), int) and getattr(self, key) > 0):
                raise ValueError(f"kernel_bench.head_configs[{self.name}].{key} must be a positive int")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"kernel_bench.head_configs[{self.name}]: num_heads must be a multiple of num_kv_heads")
        if self.mlp not in ("gated", "gelu"):
            raise ValueError(f"kernel_bench.head_configs[{self.name}].mlp must be 'gated' or 'gelu'")

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
    cpu: Mapping | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        def positive_ints(key: str) -> None:
            values = getattr(self, key)
            if not values or not all(isinstance(v, int) and v > 0 for v in values):
                raise ValueError(f"kernel_bench.{key} must be a non-empty list of positive ints, got {values!r}")

        for key in ("batch_sizes", "context_lens", "block_sizes"):
            positive_ints(key)
        if any(bs & (bs - 1) or bs > 256 for bs in self.block_sizes):
            raise ValueError(f"kernel_bench.block_sizes must be powers of two <= 256, got {self.block_sizes}")
        if not self.dtypes or any(d not in DTYPES for d in self.dtypes):
            raise ValueError(f"kernel_bench.dtypes must be from {sorted(DTYPES)}, got {self.dtypes}")
        if not self.head_configs:
            raise ValueError("kernel_bench.head_configs must name at least one head config")
        if any(b not in BASELINES for b in self.baselines):
            raise ValueError(f"kernel_bench.baselines must be from {BASELINES}, got {self.baselines}")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"kernel_bench.device must be auto, cuda or cpu, got {self.device!r}")
        if self.block_order not in ("random", "sequential"):
            raise ValueError(f"kernel_bench.block_order must be random or sequential, got {self.block_order!r}")

    @classmethod
    def from_mapping(cls, spec: Mapping) -> KernelBenchSpec:
        raw = _plain(spec)
        if not isinstance(raw, dict):
            raise ValueError(f"kernel_bench must be a mapping, got {type(spec).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"kernel_bench: unknown key(s) {unknown}; known: {sorted(known)}")
        kwargs = {}
        for key, value in raw.items():
            if key == "head_configs":
                value = tuple(_head_config(h) for h in value)
            elif isinstance(value, list):
                value = tuple(value)
            kwargs[key] = value
        return cls(**kwargs)

    def for_device(self, device: torch.device) -> KernelBenchSpec:
        """The spec with its ``cpu`` overrides applied when running on a CPU."""
        if device.type != "cpu" or not self.cpu:
            return self
        merged = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "cpu"}
        merged = {k: v for k, v in merged.items() if k != "head_configs"}
        merged["head_configs"] = [asdict(h) for h in self.head_configs]
        merged.update(_plain(self.cpu))
        return KernelBenchSpec.from_mapping(merged)


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


def _head_config(raw) -> HeadConfig:
    if isinstance(raw, HeadConfig):
        return raw
    raw = _plain(raw)
    known = {f.name for f in fields(HeadConfig)}
    unknown = sorted(set(raw) - known)
    if unknown or "name" not in raw:
        raise ValueError(f"kernel_bench.head_configs entry {raw!r}: needs name, num_heads, num_kv_heads, "
                         f"head_dim (optional {sorted(known - {'name', 'num_heads', 'num_kv_heads', 'head_dim'})})")
    return HeadConfig(**raw)


def load_spec(path: Path) -> dict:
    """The ``kernel_bench`` node of a YAML file (a Hydra experiment file or a bare spec)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return cfg.get("kernel_bench", cfg)
