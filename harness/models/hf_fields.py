"""Typed reads of a Hugging Face config.json (``Fields``) and the keys the Llama layout's
families share, for the readers of ``harness.models.hf_config`` and ``harness.models.hf_layers``: a
missing or mistyped field is an ``InputError`` naming the file and the field."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from harness.errors import InputError

HF_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32"}


class Fields:
    """Typed reads of config.json's keys; a missing or mistyped key names file and field."""

    def __init__(self, config: Mapping[str, Any], file: str, prefix: str = "") -> None:
        self.config, self.file, self.prefix = config, file, prefix

    def get(self, key: str, kind: type | tuple, *, default: Any = ..., source: Mapping | None = None):
        source = self.config if source is None else source
        if key not in source:
            if default is ...:
                raise InputError("missing (the spec needs it)", path=self.file, field=self.prefix + key)
            return default
        value = source[key]
        if value is None and default is None:
            return None
        numeric = kind in (int, float, (int, float))
        if not isinstance(value, kind) or (numeric and isinstance(value, bool)):
            raise InputError(f"must be {getattr(kind, '__name__', 'a number')}, got {value!r}",
                             path=self.file, field=self.prefix + key)
        return value

    def fail(self, key: str, message: str):
        raise InputError(message, path=self.file, field=self.prefix + key)

    def nested(self, key: str) -> "Fields":
        """The fields of a nested config (a multimodal model's text_config)."""
        return Fields(self.get(key, dict), self.file, f"{self.prefix}{key}.")


def llama_keys(f: Fields) -> dict[str, Any]:
    """The keys every family of the Llama layout shares (Llama, Mistral, Qwen2)."""
    heads = f.get("num_attention_heads", int)
    hidden = f.get("hidden_size", int)
    act = f.get("hidden_act", str)
    if act != "silu":
        f.fail("hidden_act", f"{act!r} is not supported (the gated MLP is SwiGLU: silu)")
    if f.get("mlp_bias", bool, default=False):
        f.fail("mlp_bias", "MLP biases are not supported")
    head_dim = f.get("head_dim", int, default=None) or hidden // heads
    return {
        "architecture": "llama", "mlp": "gated",
        "num_layers": f.get("num_hidden_layers", int), "hidden_size": hidden,
        "num_heads": heads, "num_kv_heads": f.get("num_key_value_heads", int, default=heads),
        "head_dim": head_dim, "intermediate_size": f.get("intermediate_size", int),
        "vocab_size": f.get("vocab_size", int), "max_context": f.get("max_position_embeddings", int),
        "norm_eps": float(f.get("rms_norm_eps", (int, float))),
        "tied_embeddings": f.get("tie_word_embeddings", bool, default=False),
        "dtype": dtype_of(f), **rope_keys(f),
    }


def dtype_of(f: Fields) -> str:
    key = "torch_dtype" if "torch_dtype" in f.config else "dtype"  # transformers >= 5 writes dtype
    value = f.get(key, str)
    if value not in HF_DTYPES:
        f.fail(key, f"{value!r} is not supported (supported: {', '.join(HF_DTYPES)})")
    return HF_DTYPES[value]


def rope_keys(f: Fields) -> dict[str, Any]:
    """rope_theta and rope_scaling (transformers >= 5 nests both in rope_parameters)."""
    params = f.get("rope_parameters", dict, default=None)
    theta_source = params if params is not None and "rope_theta" in params else f.config
    theta = float(f.get("rope_theta", (int, float), default=10_000.0, source=theta_source))
    scaling = params if params is not None else f.get("rope_scaling", dict, default=None)
    where = "rope_parameters" if params is not None else "rope_scaling"
    if scaling is None:
        return {"rope_theta": theta}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return {"rope_theta": theta}
    if kind not in ("linear", "llama3"):
        f.fail(where, f"rope type {kind!r} is not supported (supported: default, linear, llama3)")
    out = {"type": kind, "factor": f.get("factor", (int, float), source=scaling)}
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            out[key] = f.get(key, (int, float), source=scaling)
        out["original_max_position_embeddings"] = f.get("original_max_position_embeddings", int,
                                                        source=scaling)
    return {"rope_theta": theta, "rope_scaling": out}


def reader(architectures: tuple[str, ...]):
    def wrap(fn: Callable[[Fields], dict[str, Any]]):
        fn.architectures = architectures
        return fn
    return wrap
