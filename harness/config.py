"""Typed, validated views of the Hydra config.

Hydra composes YAML; these frozen dataclasses are what the code uses. Each
``from_node`` rejects unknown keys and invalid values with a ``ConfigError``
that names the key (``engine.max_num_seqs``) and says how to fix it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from harness.errors import ConfigError, did_you_mean
from harness.model_layers import (LayerGroup, LinearAttentionSpec, MlaSpec, MoeSpec,
                                  attention_kv_values, layer_groups, layer_params, validate_layers)

GIB = 1024**3
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# KV cache dtypes (model.kv_dtype): the weights' dtypes and FP8 (e4m3 / e5m2, one byte)
KV_DTYPE_BYTES = {**DTYPE_BYTES, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
# The most KV slots a run may have: slot numbers (and block ids) are int32 in the block
# tables, slot mappings and kernels, and the block pool keeps per-block state in host
# memory. 2**31 slots is ~2 Gi tokens of KV: 1 TiB even for model=tiny (512 bytes a token),
# far beyond any accelerator for a real model.
MAX_KV_SLOTS = 2**31
# What the top-level ``run`` key may select (harness/__main__.py dispatches on it).
RUN_MODES = ("serve", "study", "kernels")


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
        elif sub is not None and not (value is None and _field_default(cls, key) is None):
            raise ConfigError(f"{where}.{key}: must be a mapping of {sub.__name__} keys "
                              f"({', '.join(f.name for f in dataclasses.fields(sub))}), got {value!r}")
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]  # type: ignore[misc]
    if missing:
        raise ConfigError(f"{where}.{missing[0]}: missing value; set {where}.{missing[0]}=...")
    del nested
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


@dataclass(frozen=True)
class RopeScaling:
    """config.json's ``rope_scaling``: ``linear`` (positions / factor) or ``llama3``
    (Llama-3.1: long wavelengths / factor, short ones kept, a smooth blend between)."""

    type: str
    factor: float
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    original_max_position_embeddings: int | None = None  # llama3

    def validate(self, where: str) -> None:
        _require(self.type in ROPE_SCALING_TYPES, f"{where}.type",
                 f"must be one of {', '.join(ROPE_SCALING_TYPES)}, got {self.type!r}")
        _require_number(self, where, "factor", rule=POSITIVE)
        if self.type == "llama3":
            _require_number(self, where, "low_freq_factor", "high_freq_factor", rule=POSITIVE)
            _require(self.high_freq_factor > self.low_freq_factor, f"{where}.high_freq_factor",
                     "must be above low_freq_factor")
            _require_int(self, where, "original_max_position_embeddings")


ROPE_SCALING_TYPES = ("linear", "llama3")
# What the torch executor builds for ``architecture`` (harness/engine/model.py):
# llama: RMSNorm, rotary positions, SwiGLU (mlp: gated) -- also Mistral and Qwen2;
# opt: LayerNorm, learned positions, ReLU MLP, biases on every projection.
# The other layouts are sized (weights, KV, FLOPs) for the simulator; the torch executor
# refuses them (harness/engine/model.py).
TORCH_ARCHITECTURES = ("llama", "opt")
ARCHITECTURES = (*TORCH_ARCHITECTURES, "qwen3", "qwen3_moe", "qwen3_next", "gemma2", "gemma3",
                 "deepseek_v3")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's published dimensions and the architecture the torch
    executor builds for it (``path``: a local Hugging Face checkpoint with its weights;
    ``harness.hf_config`` builds the spec from its config.json)."""

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
    architecture: str = "llama"
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling | None = None
    norm_eps: float = 1e-5
    attention_bias: bool = False  # biases on the q, k, v projections (Qwen2)
    sliding_window: int | None = None  # each query sees its last N keys (Mistral); null = all
    path: str | None = None  # a local HF checkpoint directory (null = seeded random weights)
    # Layer groups and their KV (harness/model_layers.py): the repeating kinds of the layers
    # (full, sliding, linear; null = all full, or all sliding with sliding_window), MLA
    # ranks, experts, linear-attention dimensions, and the KV cache's dtype (null = dtype).
    kv_dtype: str | None = None
    layer_pattern: tuple[str, ...] | None = None  # a YAML list, kept as a tuple (hashable)
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    linear_attention: LinearAttentionSpec | None = None
    attention_output_gate: bool = False  # q_proj also emits a per-head output gate (Qwen3-Next)

    def __post_init__(self) -> None:
        if isinstance(self.layer_pattern, list):
            object.__setattr__(self, "layer_pattern", tuple(self.layer_pattern))

    def validate(self, where: str) -> None:
        _require_str(self, where, "name")
        _require_int(self, where, "num_layers", "hidden_size", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "vocab_size", "max_context")
        _require(self.num_heads % self.num_kv_heads == 0, f"{where}.num_kv_heads",
                 f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads")
        _require(self.mlp in ("gated", "gelu", "relu"), f"{where}.mlp",
                 "must be 'gated', 'gelu' or 'relu'")
        _require(isinstance(self.dtype, str) and self.dtype in DTYPE_BYTES, f"{where}.dtype",
                 f"must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        _require_bool(self, where, "tied_embeddings")
        _require_int(self, where, "num_layers_override", optional=True)
        _require(self.architecture in ARCHITECTURES, f"{where}.architecture",
                 f"must be one of {', '.join(ARCHITECTURES)}, got {self.architecture!r}")
        _require(self.architecture != "opt" or self.mlp == "relu", f"{where}.mlp",
                 "architecture opt has a ReLU MLP: set mlp: relu")
        _require_number(self, where, "rope_theta", "norm_eps", rule=POSITIVE)
        _require_bool(self, where, "attention_bias")
        _require_int(self, where, "sliding_window", optional=True)
        _require(self.path is None or (isinstance(self.path, str) and self.path != ""),
                 f"{where}.path", f"must be a checkpoint directory or null, got {self.path!r}")
        _require(self.kv_dtype is None or (isinstance(self.kv_dtype, str)
                                           and self.kv_dtype in KV_DTYPE_BYTES), f"{where}.kv_dtype",
                 f"must be one of {', '.join(KV_DTYPE_BYTES)} or null, got {self.kv_dtype!r}")
        _require_bool(self, where, "attention_output_gate")
        validate_layers(self, where)
        if self.architecture in TORCH_ARCHITECTURES:  # what the torch executor builds has none
            beyond = [k for k in ("mla", "moe", "linear_attention", "layer_pattern")
                      if getattr(self, k) is not None] + ["attention_output_gate"] * self.attention_output_gate
            _require(not beyond, f"{where}.{beyond[0] if beyond else ''}",
                     f"architecture {self.architecture} has none: set the architecture of the layout "
                     f"({', '.join(ARCHITECTURES[len(TORCH_ARCHITECTURES):])})")

    @property
    def layers(self) -> int:
        return self.num_layers_override or self.num_layers

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        return KV_DTYPE_BYTES[self.kv_dtype or self.dtype]

    @property
    def bytes_per_slot(self) -> int:
        """KV bytes of one token over all layers as an engine without a hybrid manager
        allocates it: every layer as full attention (2 * layers * kv_heads * head_dim *
        kv dtype; an MLA layer its latent, (kv_lora_rank + qk_rope_head_dim) * kv dtype)."""
        return self.layers * attention_kv_values(self) * self.kv_dtype_bytes

    @property
    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """The layers by kind with their KV bytes a token and lifetime (one group for a
        uniform model, whose bytes_per_token is bytes_per_slot)."""
        return layer_groups(self)

    @property
    def num_params(self) -> int:
        """Weights: layers (every expert) + input embedding + LM head (unless tied)."""
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab_size * self.hidden_size
        return layer_params(self) + embeddings

    @property
    def active_params(self) -> int:
        """The weights a token is computed through: num_params with only the routed experts."""
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab_size * self.hidden_size
        return layer_params(self, experts="active") + embeddings

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes


@dataclass(frozen=True)
class FittedCostSpec:
    """Step-time coefficients fitted to measured torch runs (``python -m harness.calibrate``).

    Step time = step_overhead_s + max(per_token_s * tokens, linear_floor_s)
    + per_attention_pair_s * pairs
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
    # the linear layers' roofline floor: max(per_token_s * tokens, linear_floor_s) (the
    # weights' read time; 0 = a plain linear term, as in profiles fitted before it)
    linear_floor_s: float = 0.0
    compute_efficiency: float | None = None
    bandwidth_efficiency: float | None = None
    # The range measured: the largest batch, and the most KV a sequence held (context plus
    # output). Steps beyond it are extrapolated (``harness.engine.fit_range``); None in
    # profiles written before calibrate recorded it.
    max_batch_size: int | None = None
    max_context_len: int | None = None

    def validate(self, where: str) -> None:
        _require_str(self, where, "model")
        _require_int(self, where, "num_layers")
        _require_number(self, where, "step_overhead_s", "per_token_s", "per_attention_pair_s",
                        "per_kv_read_slot_s", "per_seq_s", "per_prefill_chunk_s", "linear_floor_s")
        _require_int(self, where, "max_batch_size", "max_context_len", optional=True)
        _require_number(self, where, "compute_efficiency", "bandwidth_efficiency", rule=FRACTION,
                        optional=True)
        _require(isinstance(self.dtype, str) and self.dtype in DTYPE_BYTES, f"{where}.dtype",
                 f"must be one of {', '.join(DTYPE_BYTES)}")

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
    # the contiguous systems' own fit (python -m harness.calibrate fits each layout apart);
    # None: ``fitted`` serves them too
    fitted_contiguous: FittedCostSpec | None = None
    # The decode-attention kernel profile (conf/kernel_profile/<name>.yaml) the operator
    # cost model uses when engine.cost.kernel_profile is null.
    kernel_profile: str = "ideal"

    def validate(self, where: str) -> None:
        _require_str(self, where, "name", "kernel_profile")
        _require_number(self, where, "memory_gib", "hbm_bandwidth_gbps", "peak_fp16_tflops",
                        rule=POSITIVE)


@dataclass(frozen=True)
class CostSpec:
    """The sim executor's cost model: ``roofline`` (one max over the step) or ``operator``
    (per-operator terms, ``harness.engine.cost_operator``), and their parameters."""

    compute_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    step_overhead_s: float = 0.002  # roofline only (the operator model has the host profile)
    model: str = "operator"
    # operator only: conf/kernel_profile/<name>.yaml (null = the hardware's kernel_profile)
    # and conf/host_profile/<name>.yaml, or paths to such files
    kernel_profile: str | None = None
    host_profile: str = "vidur_a100_llama2_7b_tp1"
    # the kernel_results.json a ``source: kernel_results`` profile reads (null = its own path)
    kernel_results: str | None = None

    def validate(self, where: str) -> None:
        _require(self.model in ("roofline", "operator"), f"{where}.model",
                 f"must be roofline or operator, got {self.model!r}")
        _require_number(self, where, "compute_efficiency", "bandwidth_efficiency", rule=FRACTION)
        _require_number(self, where, "step_overhead_s")
        for key in ("kernel_profile", "kernel_results"):
            value = getattr(self, key)
            _require(value is None or (isinstance(value, str) and value != ""), f"{where}.{key}",
                     f"must be a name, a path or null, got {value!r}")
        _require_str(self, where, "host_profile")


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
    cuda_graphs: bool = True  # CUDA: decode steps replay graphs captured per batch bucket; false = eager

    def validate(self, where: str) -> None:
        _require(self.executor in ("sim", "torch"), f"{where}.executor", "must be 'sim' or 'torch'")
        _require(self.scheduling in ("continuous", "static"), f"{where}.scheduling",
                 "must be 'continuous' or 'static'")
        _require(self.preemption in ("recompute", "swap"), f"{where}.preemption",
                 "must be 'recompute' or 'swap'")
        _require_int(self, where, "max_num_seqs", "max_num_batched_tokens")
        _require_bool(self, where, "chunked_prefill", "fast_forward", "block_tables_on_device",
                      "cuda_graphs")
        _require_number(self, where, "gpu_memory_utilization", rule=FRACTION)
        _require_number(self, where, "activation_reserve_gib", "swap_space_gib")
        _require_int(self, where, "kv_capacity_slots", optional=True, maximum=MAX_KV_SLOTS,
                     hint=" (slot numbers are int32 in the block tables and kernels)")
        _require_int(self, where, "max_model_len", optional=True)
        _require_number(self, where, "wall_time_limit_s", rule=POSITIVE, optional=True)
        _require(isinstance(self.device, str) and (self.device in ("auto", "cpu", "cuda")
                                                   or self.device.startswith("cuda:")),
                 f"{where}.device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        _require_bool(self, where, "batch_invariant", optional=True,
                      hint=" (null = on for CPU, off for CUDA)")
        _require(self.kernel_backend in ("auto", "triton", "torch"), f"{where}.kernel_backend",
                 f"must be auto, triton or torch, got {self.kernel_backend!r}")
        _require(self.sampling in ("greedy", "seeded"), f"{where}.sampling",
                 f"must be greedy or seeded, got {self.sampling!r}")
        _require_number(self, where, "telemetry_interval_s", hint=" (0 = no NVML telemetry)")
        _require_int(self, where, "cpu_threads", "profile_activation_tokens", optional=True)


@dataclass(frozen=True)
class SystemSpec:
    """One system = a KV manager configuration (with the scheduler of the run)."""

    name: str
    kind: str
    prefix_caching: bool = False
    policy: str | None = None
    arena: str = "buddy"
    block_size: int | None = None
    # the keys a manager declares for itself (its class's ``options``), as (key, value) pairs
    options: tuple[tuple[str, Any], ...] = ()

    def option(self, key: str) -> Any:
        """The value of the manager-specific catalog key ``key``."""
        return dict(self.options)[key]

    def validate(self, where: str) -> None:
        from allocators import MANAGERS  # NOTE: here, so that importing the config stays light
        _require(self.kind in MANAGERS, f"{where}.kind",
                 f"must be one of {', '.join(sorted(MANAGERS))} (a registered manager), "
                 f"got {self.kind!r}")
        _require_int(self, where, "block_size", optional=True)
        _require_bool(self, where, "prefix_caching")
        problem = MANAGERS[self.kind].system_problem(self, None)
        if problem is not None:
            raise ConfigError(f"{where}.{problem[0]}: {problem[1]}")

    @property
    def label(self) -> str:
        from allocators import MANAGERS
        return MANAGERS[self.kind].label(self)


_NESTED = {("ModelSpec", "rope_scaling"): RopeScaling, ("ModelSpec", "mla"): MlaSpec,
           ("ModelSpec", "moe"): MoeSpec, ("ModelSpec", "linear_attention"): LinearAttentionSpec,
           ("EngineSpec", "cost"): CostSpec, ("HardwareSpec", "fitted"): FittedCostSpec,
           ("HardwareSpec", "fitted_contiguous"): FittedCostSpec}


def check_run_options(cfg: Mapping[str, Any]) -> None:
    """The top-level keys a serving run reads besides the specs: ``run`` must name a mode
    (``harness/__main__.py`` sends every mode but study and kernels to the serving run, so
    a misspelt one would otherwise run a plain serve) and ``progress`` must be a boolean."""
    mode = cfg.get("run", "serve")
    if not isinstance(mode, str) or mode not in RUN_MODES:
        raise ConfigError(
            f"run: unknown run mode {mode!r}.{did_you_mean(str(mode), RUN_MODES)} Valid modes: "
            f"{', '.join(RUN_MODES)} (serve runs the systems through the engine; study and "
            "kernels come with their experiments, e.g. experiment=vllm_fig12, experiment=kernels)")
    progress = cfg.get("progress", True)
    if not isinstance(progress, bool):
        raise ConfigError(f"progress: must be true or false, got {progress!r} (progress=false "
                          "hides the progress bars)")


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


SYSTEM_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # steps_<name>.csv: never a path


def _with_options(node: dict, where: str) -> dict:
    """``node`` with the keys its manager declares (``options``) moved into ``options``;
    each must be given."""
    from allocators import MANAGERS
    kind = node.get("kind")
    declared = MANAGERS[kind].options if isinstance(kind, str) and kind in MANAGERS else ()
    missing = [key for key in declared if key not in node]
    if missing:
        raise ConfigError(f"{where}.{missing[0]}: missing value; a {kind} system needs "
                          f"{', '.join(declared)}")
    node["options"] = tuple((key, node.pop(key)) for key in declared)
    return node


def _uses_block_size(kind: Any) -> bool:
    """Whether the manager ``kind`` takes the top-level block_size (paged, radix...)."""
    from allocators import MANAGERS
    return isinstance(kind, str) and kind in MANAGERS and MANAGERS[kind].uses_block_size


def select_systems(names: Any, catalog: Mapping[str, Any], block_size: int) -> list[SystemSpec]:
    """The systems named in ``systems=[...]``, from the ``allocator`` catalog."""
    names = to_plain(names)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    catalog = to_plain(catalog) or {}
    if not isinstance(catalog, dict):
        raise ConfigError(f"allocator: must be the catalog of systems (name: its keys), got "
                          f"{catalog!r}")
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"systems: must be a list of system names from the allocator catalog, "
                          f"e.g. systems=[paged,max]; got {names!r}")
    if not names:
        raise ConfigError(f"systems: name at least one system; known: {', '.join(catalog)}")
    for key, name in [*((f"allocator.{n}", n) for n in catalog), *(("systems", n) for n in names)]:
        if not SYSTEM_NAME.fullmatch(str(name)) or name in (".", ".."):  # names files
            raise ConfigError(f"{key}: system name {name!r} must be a plain name (letters, "
                              "digits, '_', '-', '.'): it names the run's files")
    specs = []
    for name in names:
        if name not in catalog:
            raise ConfigError(
                f"systems: unknown system {name!r}; known systems: {', '.join(catalog)} "
                "(add one under allocator.<name>)"
            )
        if not isinstance(catalog[name], dict):
            raise ConfigError(f"allocator.{name}: must be a mapping of the system's keys (kind, "
                              f"...), got {catalog[name]!r}")
        node = _with_options(dict(catalog[name]), f"allocator.{name}")
        if node.get("block_size") is None and _uses_block_size(node.get("kind")):
            node["block_size"] = block_size
        specs.append(build_spec(SystemSpec, node, f"allocator.{name}", name=name))
    if len(set(names)) != len(names):
        raise ConfigError(f"systems: {names} names a system twice")
    return specs


def kv_capacity_slots(model: ModelSpec, hardware: HardwareSpec, engine: EngineSpec) -> int:
    """KV slots that fit: explicit override, or what is left after weights and activations.

    An explicit ``engine.kv_capacity_slots`` may ignore the weights (the PagedAttention
    paper's setup gives the KV cache 12 GiB outright), but its KV must fit in the
    hardware's whole memory: more is a pool the modelled device could not hold.
    """
    if engine.kv_capacity_slots is not None:
        slots = engine.kv_capacity_slots
        kv_bytes = slots * model.bytes_per_slot
        if kv_bytes > hardware.memory_gib * GIB:
            raise ConfigError(
                f"engine.kv_capacity_slots={slots:,} is more KV than hardware={hardware.name} holds: "
                f"{slots:,} slots x {model.bytes_per_slot:,} bytes ({model.name}) = "
                f"{kv_bytes / GIB:,.1f} GiB > hardware.memory_gib={hardware.memory_gib}; at most "
                f"{int(hardware.memory_gib * GIB // model.bytes_per_slot):,} slots fit (or null to "
                "derive it from the memory left after the weights)")
        return slots
    budget = hardware.memory_gib * GIB * engine.gpu_memory_utilization
    free = budget - model.weight_bytes - engine.activation_reserve_gib * GIB
    if free / model.bytes_per_slot > MAX_KV_SLOTS:
        raise ConfigError(
            f"hardware.memory_gib={hardware.memory_gib} leaves room for "
            f"{free / model.bytes_per_slot:.3g} KV slots of {model.name}, more than the "
            f"{MAX_KV_SLOTS:,} a run supports (slot numbers are int32 in the block tables and "
            "kernels): give the device's real memory, or set engine.kv_capacity_slots")
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
