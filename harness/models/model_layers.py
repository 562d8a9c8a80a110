"""Layer groups of a model spec: which layers keep what KV, and the weights they hold.

A model is a stack of layers of a few kinds (``ModelSpec.layer_pattern``, repeated over
the layers; null = every layer full attention, or sliding when ``sliding_window`` is set):

- ``full``: attention over the whole context; K and V of every token are kept for the
  sequence's life (``2 x kv_heads x head_dim`` values a token and layer). With ``mla``
  set the full layers are MLA: one latent of ``kv_lora_rank`` plus a ``qk_rope_head_dim``
  rope key a token and layer (DeepSeek-V2/V3), kept for the sequence's life.
- ``sliding``: attention over the last ``sliding_window`` tokens; older tokens' K and V
  may be dropped (Mistral, Gemma-2/3 local layers).
- ``linear``: a linear-attention layer (Gated DeltaNet, Qwen3-Next) that keeps a fixed
  recurrent state a sequence, whatever its length: ``num_value_heads x key_head_dim x
  value_head_dim`` values of state plus ``(conv_kernel - 1) x (2 x key_dim + value_dim)``
  of convolution state (the shapes vLLM's mamba state cache allocates for it).

KV is stored in ``ModelSpec.kv_dtype`` (null = the weights' dtype); the recurrent state
in the weights' dtype (vLLM's mamba cache dtype ``auto``). Weights count every expert of
a mixture-of-experts layer; FLOPs (``active_params``) only the routed ``experts_per_token``
and the shared experts. Norm weights and per-head scalars are left out, as for every model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import model_validator

from harness.spec_schema import NonNegativeInt, PositiveInt, Says, SpecProblem, spec

LAYER_KINDS = ("full", "sliding", "linear")
# what a layer group keeps of a sequence
LIFETIMES = {"full": "sequence", "mla": "sequence", "sliding": "window", "linear": "state"}


@spec
class MlaSpec:
    """Multi-head latent attention ranks (DeepSeek-V3 config.json's names)."""

    kv_lora_rank: PositiveInt
    qk_rope_head_dim: PositiveInt
    qk_nope_head_dim: PositiveInt
    v_head_dim: PositiveInt
    # null: queries projected from the hidden state directly
    q_lora_rank: Annotated[PositiveInt, Says("a positive integer", or_null="a positive integer")] | None = None

    @property
    def values_per_token(self) -> int:
        """KV values a token and layer: the latent and the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def params(self, hidden: int, heads: int) -> int:
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = (hidden * heads * qk if self.q_lora_rank is None
             else hidden * self.q_lora_rank + self.q_lora_rank * heads * qk)
        kv_down = hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_up = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_down + kv_up + heads * self.v_head_dim * hidden


@spec
class MoeSpec:
    """Mixture-of-experts MLPs: ``num_experts`` gated experts, ``experts_per_token`` routed."""

    num_experts: PositiveInt
    experts_per_token: PositiveInt
    expert_intermediate_size: PositiveInt
    shared_expert_intermediate_size: NonNegativeInt = 0  # the always-on shared experts' total width
    dense_layers: NonNegativeInt = 0  # the first N layers keep a dense MLP of intermediate_size

    @model_validator(mode="after")
    def _routed_among_experts(self) -> "MoeSpec":
        if self.experts_per_token > self.num_experts:
            raise SpecProblem("experts_per_token", f"must be at most num_experts "
                              f"({self.num_experts}), got {self.experts_per_token}")
        return self

    def params(self, hidden: int, experts: int) -> int:
        """Gated experts (3 matrices each), the shared experts and the router."""
        return (3 * hidden * (experts * self.expert_intermediate_size
                              + self.shared_expert_intermediate_size) + hidden * self.num_experts)


@spec
class LinearAttentionSpec:
    """A Gated DeltaNet layer's dimensions (Qwen3-Next config.json's linear_* keys)."""

    num_key_heads: PositiveInt
    key_head_dim: PositiveInt
    num_value_heads: PositiveInt
    value_head_dim: PositiveInt
    conv_kernel: PositiveInt

    @property
    def state_values(self) -> int:
        """Recurrent state a sequence and layer: the delta-rule state and the conv window."""
        key_dim, value_dim = self.num_key_heads * self.key_head_dim, self.num_value_heads * self.value_head_dim
        return (self.num_value_heads * self.key_head_dim * self.value_head_dim
                + (self.conv_kernel - 1) * (2 * key_dim + value_dim))

    def params(self, hidden: int) -> int:
        key_dim, value_dim = self.num_key_heads * self.key_head_dim, self.num_value_heads * self.value_head_dim
        in_proj = hidden * (2 * key_dim + 2 * value_dim + 2 * self.num_value_heads)  # q k v z, b a
        conv = (2 * key_dim + value_dim) * self.conv_kernel
        return in_proj + conv + value_dim * hidden


@dataclass(frozen=True)
class LayerGroup:
    """The layers of one kind: their KV bytes a token (all of the group's layers) and what
    they keep of a sequence (``lifetime``: sequence, window or state)."""

    kind: str  # full | mla | sliding | linear
    num_layers: int
    bytes_per_token: int  # 0 for linear layers
    state_bytes: int = 0  # bytes a sequence holds whatever its length (linear layers)
    window: int | None = None  # sliding layers: the tokens a query sees

    @property
    def lifetime(self) -> str:
        return LIFETIMES[self.kind]

    def bytes_for(self, tokens: int) -> int:
        """KV bytes a sequence of ``tokens`` needs in this group when its lifetime is kept."""
        if self.kind == "linear":
            return self.state_bytes
        kept = min(tokens, self.window) if self.kind == "sliding" else tokens
        return kept * self.bytes_per_token

    def blocks_for(self, tokens: int, block_size: int) -> int:
        """Blocks of ``block_size`` tokens the group's live tokens span at most: W tokens that
        start mid-block span ceil((W - 1) / b) + 1 blocks (at most ceil(W / b) + 1)."""
        if self.kind == "linear":
            return 1
        if self.kind == "sliding" and tokens > self.window:
            return min(math.ceil(tokens / block_size), math.ceil((self.window - 1) / block_size) + 1)
        return math.ceil(tokens / block_size)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_layers": self.num_layers, "lifetime": self.lifetime,
                "bytes_per_token": self.bytes_per_token, "state_bytes": self.state_bytes,
                "window": self.window}


def layer_kinds(spec: Any) -> list[str]:
    """The kind of each of the spec's layers (``spec.layers`` of them)."""
    pattern = spec.layer_pattern or ["sliding" if spec.sliding_window is not None else "full"]
    return [pattern[i % len(pattern)] for i in range(spec.layers)]


def validate_layers(spec: Any) -> None:
    """The layer pattern, window, MLA and linear-attention keys fit together (a
    ``SpecProblem`` naming the key when they do not)."""
    pattern = spec.layer_pattern
    if pattern is not None:
        if not pattern:
            raise SpecProblem("layer_pattern", f"must be a non-empty list of layer kinds "
                              f"({', '.join(LAYER_KINDS)}) or null, got {pattern!r}")
        bad = [k for k in pattern if k not in LAYER_KINDS]
        if bad:
            raise SpecProblem("layer_pattern", f"unsupported layer kind {bad[0]!r} "
                              f"(supported: {', '.join(LAYER_KINDS)})")
    kinds = set(layer_kinds(spec))
    if "sliding" in kinds and spec.sliding_window is None:
        raise SpecProblem("sliding_window", "layer_pattern has sliding layers: set the window")
    if spec.sliding_window is not None:
        if "sliding" not in kinds:
            raise SpecProblem("sliding_window", "set, but layer_pattern has no sliding layer")
        if spec.sliding_window > spec.max_context:
            raise SpecProblem("sliding_window", f"{spec.sliding_window} is larger than the "
                              f"context (max_context={spec.max_context})")
    if ("linear" in kinds) != (spec.linear_attention is not None):
        raise SpecProblem("linear_attention" if "linear" in kinds else "layer_pattern",
                          "linear layers in layer_pattern need linear_attention dimensions, "
                          "and linear_attention needs linear layers")
    if spec.mla is not None and "sliding" in kinds:
        raise SpecProblem("layer_pattern", "MLA with sliding-window layers is not supported")
    if spec.moe is not None and spec.moe.dense_layers > spec.num_layers:
        raise SpecProblem("moe.dense_layers", f"more than num_layers ({spec.num_layers})")


def attention_kv_values(spec: Any) -> int:
    """KV values a token and attention layer: the MLA latent, or K and V of every KV head."""
    return spec.mla.values_per_token if spec.mla is not None else 2 * spec.num_kv_heads * spec.head_dim


def layer_groups(spec: Any) -> tuple[LayerGroup, ...]:
    """The spec's layers grouped by kind, in order of first appearance."""
    counts: dict[str, int] = {}
    for kind in layer_kinds(spec):
        counts[kind] = counts.get(kind, 0) + 1
    per_layer = attention_kv_values(spec) * spec.kv_dtype_bytes
    groups = []
    for kind, n in counts.items():
        if kind == "linear":
            groups.append(LayerGroup("linear", n, 0, n * spec.linear_attention.state_values * spec.dtype_bytes))
        elif kind == "sliding":
            groups.append(LayerGroup("sliding", n, n * per_layer, window=spec.sliding_window))
        else:
            groups.append(LayerGroup("mla" if spec.mla is not None else "full", n, n * per_layer))
    return tuple(groups)


def layer_params(spec: Any, experts: str = "all") -> int:
    """Weights of all layers: attention (GQA, MLA or linear) and MLP (dense or MoE);
    ``experts="active"`` counts only the experts a token is routed through."""
    hidden, heads, hd = spec.hidden_size, spec.num_heads, spec.head_dim
    q_width = heads * hd * (2 if spec.attention_output_gate else 1)  # the gate doubles q_proj
    gqa = hidden * (q_width + 2 * spec.num_kv_heads * hd) + heads * hd * hidden
    attention = {"full": spec.mla.params(hidden, heads) if spec.mla is not None else gqa,
                 "sliding": gqa,
                 "linear": spec.linear_attention.params(hidden) if spec.linear_attention else 0}
    dense = (3 if spec.mlp == "gated" else 2) * hidden * spec.intermediate_size
    moe = spec.moe
    total = 0
    for i, kind in enumerate(layer_kinds(spec)):
        total += attention[kind]
        if moe is None or i < moe.dense_layers:
            total += dense
        else:
            total += moe.params(hidden, moe.num_experts if experts == "all" else moe.experts_per_token)
    return total
