"""config.json readers for the families with layer groups (``harness/models/hf_config.py`` registers
them): Qwen3 and Qwen3-MoE, Gemma-2 and Gemma-3 (local and global layers), DeepSeek-V3 (MLA
and experts), Qwen3-Next (linear-attention hybrid).

Each returns ModelSpec keys (``harness/models/model_layers.py`` explains the layer kinds). The
layer pattern comes from config.json's ``layer_types`` when present, else from the family's
own key (``sliding_window_pattern``, ``full_attention_interval``) or its documented default
(Gemma-2 alternates, local first); it is stored as its shortest repeating period. These
layouts are sized for ``engine=sim``; the torch executor refuses them. A missing field, an
unknown layer type or a per-layer pattern the spec cannot state is a one-line error naming
the field.
"""

from __future__ import annotations

from typing import Any

from harness.models.hf_fields import Fields, dtype_of, llama_keys, reader, rope_keys

LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear"}


def shortest_period(kinds: list[str]) -> list[str]:
    """The shortest prefix whose repetition gives ``kinds`` (truncated to its length)."""
    for period in range(1, len(kinds) + 1):
        if all(kinds[i] == kinds[i % period] for i in range(len(kinds))):
            return kinds[:period]
    return kinds


def _layer_pattern(f: Fields, layers: int, default: list[str]) -> list[str]:
    types = f.get("layer_types", list, default=None)
    if types is None:
        return default
    if len(types) != layers:
        f.fail("layer_types", f"has {len(types)} entries for num_hidden_layers={layers}")
    bad = [t for t in types if t not in LAYER_TYPES]
    if bad:
        f.fail("layer_types", f"{bad[0]!r} is not a supported layer type (supported: "
                              f"{', '.join(LAYER_TYPES)})")
    return shortest_period([LAYER_TYPES[t] for t in types])


def _moe(f: Fields, experts_key: str, *, shared: int = 0, dense_layers: int = 0) -> dict[str, Any]:
    if f.get("decoder_sparse_step", int, default=1) != 1 or f.get("moe_layer_freq", int, default=1) != 1:
        key = "decoder_sparse_step" if "decoder_sparse_step" in f.config else "moe_layer_freq"
        f.fail(key, "experts on every N-th layer only are not supported (1: every layer)")
    if f.get("mlp_only_layers", list, default=[]):
        f.fail("mlp_only_layers", "a per-layer dense/expert pattern is not supported")
    return {"num_experts": f.get(experts_key, int), "experts_per_token": f.get("num_experts_per_tok", int),
            "expert_intermediate_size": f.get("moe_intermediate_size", int),
            "shared_expert_intermediate_size": shared, "dense_layers": dense_layers}


def _no_sliding(f: Fields) -> None:
    if f.get("use_sliding_window", bool, default=False):
        f.fail("use_sliding_window", "a sliding window on Qwen3's bottom layers is not supported")


@reader(("Qwen3ForCausalLM",))
def _qwen3(f: Fields) -> dict[str, Any]:
    keys = {**llama_keys(f), "architecture": "qwen3"}
    if f.get("attention_bias", bool, default=False):
        f.fail("attention_bias", "Qwen3 attention biases are not supported")
    _no_sliding(f)
    return keys


@reader(("Qwen3MoeForCausalLM",))
def _qwen3_moe(f: Fields) -> dict[str, Any]:
    keys = {**_qwen3(f), "architecture": "qwen3_moe"}
    return {**keys, "moe": _moe(f, "num_experts")}


@reader(("Qwen3NextForCausalLM",))
def _qwen3_next(f: Fields) -> dict[str, Any]:
    keys = {**llama_keys(f), "architecture": "qwen3_next", "attention_output_gate": True}
    interval = f.get("full_attention_interval", int, default=4)  # Qwen3NextConfig's default
    pattern = _layer_pattern(f, keys["num_layers"], ["linear"] * (interval - 1) + ["full"])
    keys["layer_pattern"] = pattern
    if "linear" in pattern:
        keys["linear_attention"] = {
            "num_key_heads": f.get("linear_num_key_heads", int),
            "key_head_dim": f.get("linear_key_head_dim", int),
            "num_value_heads": f.get("linear_num_value_heads", int),
            "value_head_dim": f.get("linear_value_head_dim", int),
            "conv_kernel": f.get("linear_conv_kernel_dim", int)}
    shared = f.get("shared_expert_intermediate_size", int, default=0)
    return {**keys, "moe": _moe(f, "num_experts", shared=shared)}


def _gemma_keys(f: Fields, default_pattern: list[str]) -> dict[str, Any]:
    """Gemma-2/3 text layers: GeGLU MLP, tied embeddings, local and global layers."""
    act = f.get("hidden_activation", str, default=None) or f.get("hidden_act", str)
    if act not in ("gelu_pytorch_tanh", "gelu"):
        f.fail("hidden_activation", f"{act!r} is not supported (Gemma's gated MLP is GeGLU)")
    layers = f.get("num_hidden_layers", int)
    heads = f.get("num_attention_heads", int)
    return {
        "mlp": "gated", "num_layers": layers, "hidden_size": f.get("hidden_size", int),
        "num_heads": heads, "num_kv_heads": f.get("num_key_value_heads", int, default=heads),
        "head_dim": f.get("head_dim", int), "intermediate_size": f.get("intermediate_size", int),
        "vocab_size": f.get("vocab_size", int), "max_context": f.get("max_position_embeddings", int),
        "norm_eps": float(f.get("rms_norm_eps", (int, float))),
        "tied_embeddings": f.get("tie_word_embeddings", bool, default=True),
        "sliding_window": f.get("sliding_window", int),
        "layer_pattern": _layer_pattern(f, layers, default_pattern), **rope_keys(f),
    }


@reader(("Gemma2ForCausalLM",))
def _gemma2(f: Fields) -> dict[str, Any]:
    # transformers' Gemma2Config: layer i is local where (i + 1) % 2, local first
    return {**_gemma_keys(f, ["sliding", "full"]), "architecture": "gemma2", "dtype": dtype_of(f)}


def _gemma3_keys(text: Fields) -> dict[str, Any]:
    # transformers' Gemma3TextConfig: layer i is global where (i + 1) % pattern == 0
    period = text.get("sliding_window_pattern", int, default=6)
    return {**_gemma_keys(text, ["sliding"] * (period - 1) + ["full"]), "architecture": "gemma3"}


@reader(("Gemma3ForCausalLM",))
def _gemma3_text(f: Fields) -> dict[str, Any]:
    return {**_gemma3_keys(f), "dtype": dtype_of(f)}


@reader(("Gemma3ForConditionalGeneration",))
def _gemma3(f: Fields) -> dict[str, Any]:
    """A multimodal Gemma-3: its text_config's layers (the vision tower is not counted)."""
    return {**_gemma3_keys(f.nested("text_config")), "dtype": dtype_of(f)}


@reader(("DeepseekV3ForCausalLM",))
def _deepseek_v3(f: Fields) -> dict[str, Any]:
    """MLA and experts; rope_scaling (yarn) is not read: the simulator has no positions."""
    if f.get("hidden_act", str) != "silu":
        f.fail("hidden_act", "the gated MLP is SwiGLU: silu")
    heads = f.get("num_attention_heads", int)
    rope, nope = f.get("qk_rope_head_dim", int), f.get("qk_nope_head_dim", int)
    expert = f.get("moe_intermediate_size", int)
    return {
        "architecture": "deepseek_v3", "mlp": "gated", "num_layers": f.get("num_hidden_layers", int),
        "hidden_size": f.get("hidden_size", int), "num_heads": heads,
        "num_kv_heads": f.get("num_key_value_heads", int, default=heads), "head_dim": nope + rope,
        "intermediate_size": f.get("intermediate_size", int), "vocab_size": f.get("vocab_size", int),
        "max_context": f.get("max_position_embeddings", int),
        "norm_eps": float(f.get("rms_norm_eps", (int, float))),
        "tied_embeddings": f.get("tie_word_embeddings", bool, default=False), "dtype": dtype_of(f),
        "rope_theta": float(f.get("rope_theta", (int, float), default=10_000.0)),
        "mla": {"kv_lora_rank": f.get("kv_lora_rank", int), "qk_rope_head_dim": rope,
                "qk_nope_head_dim": nope, "v_head_dim": f.get("v_head_dim", int),
                "q_lora_rank": f.get("q_lora_rank", int, default=None)},
        "moe": _moe(f, "n_routed_experts", shared=f.get("n_shared_experts", int, default=0) * expert,
                    dense_layers=f.get("first_k_dense_replace", int, default=0)),
    }


# model_type -> reader of its config.json
FAMILIES = {"qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "qwen3_next": _qwen3_next,
            "gemma2": _gemma2, "gemma3_text": _gemma3_text, "gemma3": _gemma3,
            "deepseek_v3": _deepseek_v3}
