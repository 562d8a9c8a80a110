"""The model spec: a decoder-only transformer's dimensions (``ModelSpec``), its
``rope_scaling``, the dtype tables and the architectures the code knows. The layer
groups (sliding window, MLA, MoE, linear attention) are in ``harness.models.model_layers``."""

from __future__ import annotations

from dataclasses import dataclass

from harness.models.model_layers import (LayerGroup, LinearAttentionSpec, MlaSpec, MoeSpec,
                                  attention_kv_values, layer_groups, layer_params, validate_layers)
from harness.config.spec_checks import (_NESTED, POSITIVE, _require, _require_bool, _require_int,
                                 _require_number, _require_str)

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# KV cache dtypes (model.kv_dtype): the weights' dtypes and FP8 (e4m3 / e5m2, one byte)
KV_DTYPE_BYTES = {**DTYPE_BYTES, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


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
    ``harness.models.hf_config`` builds the spec from its config.json)."""

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
    # Layer groups and their KV (harness/models/model_layers.py): the repeating kinds of the layers
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


_NESTED.update({("ModelSpec", "rope_scaling"): RopeScaling, ("ModelSpec", "mla"): MlaSpec,
                ("ModelSpec", "moe"): MoeSpec, ("ModelSpec", "linear_attention"): LinearAttentionSpec})
