"""Typed, validated views of the Hydra config.

Hydra composes YAML; these frozen dataclasses are what the code uses. Each
``from_node`` rejects unknown keys and invalid values with a ``ConfigError``
that names the key (``engine.max_num_seqs``) and says how to fix it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from harness.errors import ConfigError, did_you_mean

GIB = 1024**3
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


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
    nested = {f.name: f.type for f in dataclasses.fields(cls)}
    for key, value in list(data.items()):
        sub = _NESTED.get((cls.__name__, key))
        if sub is not None and isinstance(value, Mapping):
            data[key] = build_spec(sub, value, f"{where}.{key}")
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]  # type: ignore[misc]
    if missing:
        raise ConfigError(f"{where}.{missing[0]}: missing value; set {where}.{missing[0]}=...")
    del nested
    obj = cls(**data)
    obj.validate(where)
    return obj


def _require(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {message}")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's published dimensions."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_context: int
    mlp: str = "gated"
    dtype: str = "float16"
    tied_embeddings: bool = False
    num_layers_override: int | None = None

    def validate(self, where: str) -> None:
        for key in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "vocab_size", "max_context"):
            _require(isinstance(getattr(self, key), int) and getattr(self, key) > 0,
                     f"{where}.{key}", f"must be a positive integer, got {getattr(self, key)!r}")
        _require(self.num_heads % self.num_kv_heads == 0, f"{where}.num_kv_heads",
                 f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads")
        _require(self.mlp in ("gated", "gelu"), f"{where}.mlp", "must be 'gated' or 'gelu'")
        _require(self.dtype in DTYPE_BYTES, f"{where}.dtype",
                 f"must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.num_layers_override is not None:
            _require(self.num_layers_override > 0, f"{where}.num_layers_override", "must be > 0")

    @property
    def layers(self) -> int:
        return self.num_layers_override or self.num_layers

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_slot(self) -> int:
        """KV bytes of one token over all layers: 2 * layers * kv_heads * head_dim * dtype."""
        return 2 * self.layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def params_per_layer(self) -> int:
        attn = self.hidden_size * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        attn += self.num_heads * self.head_dim * self.hidden_size
        mats = 3 if self.mlp == "gated" else 2
        return attn + mats * self.hidden_size * self.intermediate_size

    @property
    def num_params(self) -> int:
        """Weights: layers + input embedding + LM head (unless tied)."""
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab_size * self.hidden_size
        return self.layers * self.params_per_layer + embeddings

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes


@dataclass(frozen=True)
class FittedCostSpec:
    """Step-time coefficients fitted to measured torch runs (``python -m harness.calibrate``).

    Step time = step_overhead_s + per_token_s * tokens + per_attention_pair_s * pairs
    + per_kv_read_slot_s * cached slots read + per_seq_s * sequences
    + per_prefill_chunk_s * prefill chunks (+ copies and swaps as in the roofline).
    Used for the model it was measured on (name, layers, dtype); other models get the
    roofline with the derived ``compute_efficiency`` / ``bandwidth_efficiency``.
    """

    model: str
    num_layers: int
    dtype: str
    step_overhead_s: float
    per_token_s: float
    per_attention_pair_s: float
    per_kv_read_slot_s: float
    per_seq_s: float
    per_prefill_chunk_s: float = 0.0
    compute_efficiency: float | None = None
    bandwidth_efficiency: float | None = None
    # The range measured: the largest batch, and the most KV a sequence held (context plus
    # output). Steps beyond it are extrapolated (``harness.engine.fit_range``); None in
    # profiles written before calibrate recorded it.
    max_batch_size: int | None = None
    max_context_len: int | None = None

    def validate(self, where: str) -> None:
        for key in ("step_overhead_s", "per_token_s", "per_attention_pair_s", "per_kv_read_slot_s",
                    "per_seq_s", "per_prefill_chunk_s"):
            value = getattr(self, key)
            _require(isinstance(value, (int, float)) and value >= 0, f"{where}.{key}",
                     f"must be a number >= 0, got {value!r}")
        for key in ("max_batch_size", "max_context_len"):
            value = getattr(self, key)
            _require(value is None or (isinstance(value, int) and not isinstance(value, bool)
                                       and value > 0),
                     f"{where}.{key}", f"must be a positive integer or null, got {value!r}")
        for key in ("compute_efficiency", "bandwidth_efficiency"):
            value = getattr(self, key)
            if value is not None:
                _require(0 < value <= 1, f"{where}.{key}", f"must be in (0, 1] or null, got {value!r}")
        _require(self.dtype in DTYPE_BYTES, f"{where}.dtype", f"must be one of {', '.join(DTYPE_BYTES)}")

    def applies_to(self, model: "ModelSpec") -> bool:
        return (self.model == model.name and self.num_layers == model.layers
                and self.dtype == model.dtype)


@dataclass(frozen=True)
class HardwareSpec:
    """An accelerator's memory and peak rates (and, once calibrated, fitted step costs)."""

    name: str
    memory_gib: float
    hbm_bandwidth_gbps: float
    peak_fp16_tflops: float
    fitted: FittedCostSpec | None = None

    def validate(self, where: str) -> None:
        for key in ("memory_gib", "hbm_bandwidth_gbps", "peak_fp16_tflops"):
            value = getattr(self, key)
            _require(isinstance(value, (int, float)) and value > 0, f"{where}.{key}",
                     f"must be a positive number, got {value!r}")


@dataclass(frozen=True)
class CostSpec:
    """Efficiency factors of the sim executor's roofline."""

    compute_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    step_overhead_s: float = 0.002

    def validate(self, where: str) -> None:
        for key in ("compute_efficiency", "bandwidth_efficiency"):
            value = getattr(self, key)
            _require(0 < value <= 1, f"{where}.{key}", f"must be in (0, 1], got {value!r}")
        _require(self.step_overhead_s >= 0, f"{where}.step_overhead_s", "must be >= 0")


@dataclass(frozen=True)
class EngineSpec:
    """Scheduler and executor settings."""

    executor: str = "sim"
    scheduling: str = "continuous"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = False
    preemption: str = "recompute"
    gpu_memory_utilization: float = 0.9
    activation_reserve_gib: float = 2.0
    kv_capacity_slots: int | None = None
    swap_space_gib: float = 4.0
    max_model_len: int | None = None
    wall_time_limit_s: float | None = None
    fast_forward: bool = True
    cost: CostSpec = field(default_factory=CostSpec)
    # --- torch executor (engine=torch); the sim executor ignores these ---
    device: str = "auto"  # auto (cuda if available, else cpu) | cpu | cuda | cuda:N
    # Accumulate every op in float64 and round to the model dtype, so a token's result
    # does not depend on batch composition or kernel path (paged == contiguous token for
    # token). null = on for CPU, off for CUDA.
    batch_invariant: bool | None = None
    kernel_backend: str = "auto"  # auto (Triton on CUDA, torch reference on CPU) | triton | torch
    block_tables_on_device: bool = False  # keep block tables resident; upload changed rows only
    sampling: str = "seeded"  # greedy (every sample argmax) | seeded (sample 0 greedy, others seeded)
    telemetry_interval_s: float = 0.1  # NVML sampling period in seconds (0 = no telemetry)
    profile_activation_tokens: int | None = None  # capacity profiling pass; null = max_num_batched_tokens
    cpu_threads: int | None = None  # torch intra-op threads for CPU runs (null = torch's default)

    def validate(self, where: str) -> None:
        _require(self.executor in ("sim", "torch"), f"{where}.executor", "must be 'sim' or 'torch'")
        _require(self.scheduling in ("continuous", "static"), f"{where}.scheduling",
                 "must be 'continuous' or 'static'")
        _require(self.preemption in ("recompute", "swap"), f"{where}.preemption",
                 "must be 'recompute' or 'swap'")
        for key in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, key)
            _require(isinstance(value, int) and value > 0, f"{where}.{key}",
                     f"must be a positive integer, got {value!r}")
        _require(0 < self.gpu_memory_utilization <= 1, f"{where}.gpu_memory_utilization",
                 f"must be in (0, 1], got {self.gpu_memory_utilization}")
        _require(self.activation_reserve_gib >= 0, f"{where}.activation_reserve_gib", "must be >= 0")
        _require(self.swap_space_gib >= 0, f"{where}.swap_space_gib", "must be >= 0")
        if self.kv_capacity_slots is not None:
            _require(isinstance(self.kv_capacity_slots, int) and self.kv_capacity_slots > 0,
                     f"{where}.kv_capacity_slots", f"must be a positive integer or null, got "
                     f"{self.kv_capacity_slots!r}")
        if self.max_model_len is not None:
            _require(isinstance(self.max_model_len, int) and self.max_model_len > 0,
                     f"{where}.max_model_len", "must be a positive integer or null")
        if self.wall_time_limit_s is not None:
            _require(self.wall_time_limit_s > 0, f"{where}.wall_time_limit_s", "must be > 0 or null")
        _require(isinstance(self.device, str) and (self.device in ("auto", "cpu", "cuda")
                                                   or self.device.startswith("cuda:")),
                 f"{where}.device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        _require(self.batch_invariant in (None, True, False), f"{where}.batch_invariant",
                 "must be true, false or null (null = on for CPU, off for CUDA)")
        _require(self.kernel_backend in ("auto", "triton", "torch"), f"{where}.kernel_backend",
                 f"must be auto, triton or torch, got {self.kernel_backend!r}")
        _require(self.sampling in ("greedy", "seeded"), f"{where}.sampling",
                 f"must be greedy or seeded, got {self.sampling!r}")
        _require(isinstance(self.telemetry_interval_s, (int, float)) and self.telemetry_interval_s >= 0,
                 f"{where}.telemetry_interval_s", "must be >= 0 (0 = no NVML telemetry)")
        if self.cpu_threads is not None:
            _require(isinstance(self.cpu_threads, int) and self.cpu_threads > 0,
                     f"{where}.cpu_threads", "must be a positive integer or null")
        if self.profile_activation_tokens is not None:
            _require(isinstance(self.profile_activation_tokens, int) and self.profile_activation_tokens > 0,
                     f"{where}.profile_activation_tokens", "must be a positive integer or null")


@dataclass(frozen=True)
class SystemSpec:
    """One system = a KV manager configuration (with the scheduler of the run)."""

    name: str
    kind: str
    prefix_caching: bool = False
    policy: str | None = None
    arena: str = "buddy"
    block_size: int | None = None

    def validate(self, where: str) -> None:
        _require(self.kind in ("paged", "contiguous"), f"{where}.kind",
                 f"must be 'paged' or 'contiguous', got {self.kind!r}")
        if self.kind == "contiguous":
            _require(self.policy in ("max", "pow2", "oracle"), f"{where}.policy",
                     f"must be max, pow2 or oracle, got {self.policy!r}")
            _require(self.arena in ("buddy", "first_fit", "best_fit"), f"{where}.arena",
                     f"must be buddy, first_fit or best_fit, got {self.arena!r}")
        if self.block_size is not None:
            _require(isinstance(self.block_size, int) and self.block_size > 0,
                     f"{where}.block_size", f"must be a positive integer, got {self.block_size!r}")

    @property
    def label(self) -> str:
        if self.kind == "paged":
            return f"paged (block {self.block_size}{', prefix cache' if self.prefix_caching else ''})"
        return f"contiguous {self.policy} ({self.arena})"


_NESTED = {("EngineSpec", "cost"): CostSpec, ("HardwareSpec", "fitted"): FittedCostSpec}


def wants_report(cfg: Mapping[str, Any]) -> bool:
    """The top-level ``report`` key: whether the run writes report.html (default true)."""
    report = cfg.get("report", True)
    if not isinstance(report, bool):
        raise ConfigError(f"report: must be true or false, got {report!r} (report=false skips "
                          "report.html; python -m reports DIR renders it later)")
    return report


def validate_block_size(value: Any) -> int:
    """The top-level block_size: a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"block_size: must be a positive integer (tokens per KV block, e.g. 16), got {value!r}"
        )
    return value


def select_systems(names: Any, catalog: Mapping[str, Any], block_size: int) -> list[SystemSpec]:
    """The systems named in ``systems=[...]``, from the ``allocator`` catalog."""
    names = to_plain(names)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    catalog = to_plain(catalog) or {}
    if not names:
        raise ConfigError(f"systems: name at least one system; known: {', '.join(catalog)}")
    specs = []
    for name in names:
        if name not in catalog:
            raise ConfigError(
                f"systems: unknown system {name!r}; known systems: {', '.join(catalog)} "
                "(add one under allocator.<name>)"
            )
        node = dict(catalog[name])
        if node.get("kind") == "paged" and node.get("block_size") is None:
            node["block_size"] = block_size
        specs.append(build_spec(SystemSpec, node, f"allocator.{name}", name=name))
    if len(set(names)) != len(names):
        raise ConfigError(f"systems: {names} names a system twice")
    return specs


def kv_capacity_slots(model: ModelSpec, hardware: HardwareSpec, engine: EngineSpec) -> int:
    """KV slots that fit: explicit override, or what is left after weights and activations."""
    if engine.kv_capacity_slots is not None:
        return engine.kv_capacity_slots
    budget = hardware.memory_gib * GIB * engine.gpu_memory_utilization
    free = budget - model.weight_bytes - engine.activation_reserve_gib * GIB
    slots = int(free // model.bytes_per_slot)
    if slots <= 0:
        raise ConfigError(
            f"model={model.name} does not fit hardware={hardware.name}: weights take "
            f"{model.weight_bytes / GIB:.1f} GiB of {hardware.memory_gib * engine.gpu_memory_utilization:.1f} "
            f"GiB usable ({hardware.memory_gib} GiB x engine.gpu_memory_utilization="
            f"{engine.gpu_memory_utilization}; +{engine.activation_reserve_gib} GiB activations, "
            "engine.activation_reserve_gib), leaving no KV cache. Choose a larger hardware "
            "profile, a smaller model, raise engine.gpu_memory_utilization, or set "
            "engine.kv_capacity_slots."
        )
    return slots
