"""The model spec: a decoder-only transformer's dimensions (``ModelSpec``), its
``rope_scaling``, the dtype tables and the architectures the code knows. The layer
groups (sliding window, MLA, MoE, linear attention) are in ``harness.models.model_layers``."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict, model_validator

from harness.models.model_layers import (LAYER_KINDS, LayerGroup, LinearAttentionSpec, MlaSpec,
                                         MoeSpec, attention_kv_values, layer_groups, layer_params,
                                         validate_layers)
from harness.spec_schema import (Flag, Name, PositiveInt, PositiveNumber, Says, SpecProblem,
                                 one_of, spec)

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# KV cache dtypes (model.kv_dtype): the weights' dtypes and FP8 (e4m3 / e5m2, one byte)
KV_DTYPE_BYTES = {**DTYPE_BYTES, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
ROPE_SCALING_TYPES = ("linear", "llama3")
# What the torch executor builds for ``architecture`` (harness/engine/model.py):
# llama: RMSNorm, rotary positions, SwiGLU (mlp: gated) -- also Mistral and Qwen2;
# opt: LayerNorm, learned positions, ReLU MLP, biases on every projection.
# The other layouts are sized (weights, KV, FLOPs) for the simulator; the torch executor
# refuses them (harness/engine/model.py).
TORCH_ARCHITECTURES = ("llama", "opt")
ARCHITECTURES = (*TORCH_ARCHITECTURES, "qwen3", "qwen3_moe", "qwen3_next", "gemma2", "gemma3",
                 "deepseek_v3")
LayerPattern = Annotated[tuple[str, ...], Says(f"a non-empty list of layer kinds "
                                               f"({', '.join(LAYER_KINDS)})")]


@spec
class RopeScaling:
    """config.json's ``rope_scaling``: ``linear`` (positions / factor) or ``llama3``
    (Llama-3.1: long wavelengths / factor, short ones kept, a smooth blend between)."""

    type: one_of(ROPE_SCALING_TYPES)
    factor: PositiveNumber
    low_freq_factor: PositiveNumber | None = None  # llama3
    high_freq_factor: PositiveNumber | None = None  # llama3
    original_max_position_embeddings: PositiveInt | None = None  # llama3

    @model_validator(mode="after")
    def _llama3_keys(self) -> "RopeScaling":
        if self.type == "llama3":
            for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
                if getattr(self, key) is None:
                    what = "integer" if key.startswith("original") else "number"
                    raise SpecProblem(key, f"must be a positive {what}, got None")
            if self.high_freq_factor <= self.low_freq_factor:
                raise SpecProblem("high_freq_factor", "must be above low_freq_factor")
        return self


@spec
class ModelSpec:
    """A decoder-only transformer's published dimensions and the architecture the torch
    executor builds for it (``path``: a local Hugging Face checkpoint with its weights;
    ``harness.models.hf_config`` builds the spec from its config.json)."""

    name: Name
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    intermediate_size: PositiveInt
    vocab_size: PositiveInt
    max_context: PositiveInt
    mlp: one_of(("gated", "gelu", "relu"), Says("'gated', 'gelu' or 'relu'", got=False)) = "gated"
    dtype: one_of(DTYPE_BYTES) = "float16"
    tied_embeddings: Flag = False
    num_layers_override: PositiveInt | None = None
    architecture: one_of(ARCHITECTURES) = "llama"
    rope_theta: PositiveNumber = 10_000.0
    rope_scaling: RopeScaling | None = None
    norm_eps: PositiveNumber = 1e-5
    attention_bias: Flag = False  # biases on the q, k, v projections (Qwen2)
    sliding_window: PositiveInt | None = None  # each query sees its last N keys (Mistral); null = all
    # a local HF checkpoint directory (null = seeded random weights)
    path: Annotated[str, Strict(), Field(min_length=1), Says("a checkpoint directory")] | None = None
    # Layer groups and their KV (harness/models/model_layers.py): the repeating kinds of the layers
    # (full, sliding, linear; null = all full, or all sliding with sliding_window), MLA
    # ranks, experts, linear-attention dimensions, and the KV cache's dtype (null = dtype).
    kv_dtype: one_of(KV_DTYPE_BYTES) | None = None
    layer_pattern: LayerPattern | None = None  # a YAML list, kept as a tuple (hashable)
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    linear_attention: LinearAttentionSpec | None = None
    attention_output_gate: Flag = False  # q_proj also emits a per-head output gate (Qwen3-Next)

    def __post_init__(self) -> None:
        if isinstance(self.layer_pattern, list):  # (a spec built in code from a YAML list)
            object.__setattr__(self, "layer_pattern", tuple(self.layer_pattern))

    @model_validator(mode="after")
    def _fields_fit_together(self) -> "ModelSpec":
        if self.num_heads % self.num_kv_heads:
            raise SpecProblem("num_kv_heads", f"num_heads ({self.num_heads}) must be a multiple "
                              "of num_kv_heads")
        if self.architecture == "opt" and self.mlp != "relu":
            raise SpecProblem("mlp", "architecture opt has a ReLU MLP: set mlp: relu")
        validate_layers(self)
        if self.architecture in TORCH_ARCHITECTURES:  # what the torch executor builds has none
            beyond = [k for k in ("mla", "moe", "linear_attention", "layer_pattern")
                      if getattr(self, k) is not None] + ["attention_output_gate"] * self.attention_output_gate
            if beyond:
                raise SpecProblem(beyond[0], f"architecture {self.architecture} has none: set the "
                                  "architecture of the layout "
                                  f"({', '.join(ARCHITECTURES[len(TORCH_ARCHITECTURES):])})")
        return self

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
