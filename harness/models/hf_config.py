"""A ``ModelSpec`` from a local Hugging Face checkpoint's config.json (``model=hf model.path=DIR``).

``load_model_spec(node)`` is how a run builds its model spec: a node without ``path`` is a
conf/model YAML (``build_spec``); with ``path`` (a directory, or its config.json) the
dimensions, rotary settings, tied embeddings, sliding window and dtype come from
config.json, and only ``name``, ``dtype``, ``max_context`` and ``num_layers_override`` may
be set beside it. Families are read by ``FAMILIES`` (model_type -> reader); each reader
returns ModelSpec keys, so a new family (or new spec keys: MLA ranks, experts, layer
patterns) is one more reader. Unknown architectures and missing fields are one-line
errors naming the file and the field. Nothing is downloaded.

Defaults used when config.json omits a key are transformers' documented defaults for
that config class (``num_key_value_heads`` = ``num_attention_heads``, ``rope_theta``
10000, ``tie_word_embeddings`` false); every other key is required.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.models.model_spec import ModelSpec
from harness.spec_schema import build_spec, to_plain
from harness.errors import ConfigError, InputError
from harness.fileio import read_json
from harness.models.hf_fields import Fields, dtype_of, llama_keys, reader
from harness.models.hf_layers import FAMILIES as LAYER_FAMILIES

# keys a model=hf node may set beside path (the rest come from config.json)
OVERRIDABLE = ("name", "dtype", "kv_dtype", "max_context", "num_layers_override")


def load_model_spec(node: Any, where: str = "model") -> ModelSpec:
    """The run's ModelSpec: from the YAML node, or from config.json when ``path`` is set."""
    data = dict(to_plain(node) or {})
    if data.get("path") is None:
        if "path" in data and data.get("name") is None:
            raise ConfigError(f"{where}.path: model=hf needs a checkpoint directory: set "
                              f"{where}.path=DIR (a local Hugging Face directory with config.json)")
        return build_spec(ModelSpec, data, where)
    extra = sorted(k for k, v in data.items() if v is not None and k not in (*OVERRIDABLE, "path"))
    if extra:
        raise ConfigError(f"{where}.{extra[0]}: comes from the checkpoint's config.json when "
                          f"{where}.path is set; only {', '.join(OVERRIDABLE)} may be set beside it")
    keys = spec_keys(data["path"])
    longest = keys["max_context"]
    keys.update({k: data[k] for k in OVERRIDABLE if data.get(k) is not None})
    spec = build_spec(ModelSpec, keys, where)
    if spec.max_context > longest:
        raise ConfigError(f"{where}.max_context={spec.max_context}: the checkpoint's "
                          f"max_position_embeddings is {longest}; set at most that")
    return spec


def config_path(path: str) -> Path:
    """DIR/config.json (or the given config.json), which must exist."""
    given = Path(path).expanduser()
    file = given if given.name == "config.json" else given / "config.json"
    if not file.is_file():
        raise ConfigError(f"model.path={path}: no {file} (a local Hugging Face checkpoint "
                          "directory holds config.json and *.safetensors; nothing is downloaded)")
    return file


def spec_keys(path: str) -> dict[str, Any]:
    """ModelSpec keys read from the config.json at ``path`` (``path`` and ``name`` included)."""
    file = config_path(path)
    config = read_json(file)  # (an InputError naming file, line and field when it is not JSON)
    if not isinstance(config, dict):
        raise InputError("must hold a JSON object", path=str(file))
    fields = Fields(config, str(file))
    model_type = fields.get("model_type", str)
    reader = FAMILIES.get(model_type)
    if reader is None:
        raise InputError(f"{model_type!r} is not supported (supported: "
                         f"{', '.join(sorted(FAMILIES))})", path=str(file), field="model_type")
    architectures = fields.get("architectures", list, default=[])
    if architectures and architectures[0] not in reader.architectures:
        raise InputError(f"{architectures[0]!r} is not supported (supported: "
                         f"{', '.join(reader.architectures)})", path=str(file), field="architectures")
    keys = reader(fields)
    keys.update(path=str(file.parent.resolve()), name=file.parent.resolve().name or "hf")
    return keys


@reader(("LlamaForCausalLM",))
def _llama(f: Fields) -> dict[str, Any]:
    if f.get("attention_bias", bool, default=False):
        f.fail("attention_bias", "Llama attention biases (q, k, v and o) are not supported")
    return llama_keys(f)


@reader(("MistralForCausalLM",))
def _mistral(f: Fields) -> dict[str, Any]:
    return {**llama_keys(f), "sliding_window": f.get("sliding_window", int, default=None)}


@reader(("Qwen2ForCausalLM",))
def _qwen2(f: Fields) -> dict[str, Any]:
    keys = {**llama_keys(f), "attention_bias": True}  # Qwen2: q, k, v biases; o has none
    if f.get("use_sliding_window", bool, default=False):
        layers = keys["num_layers"]
        if f.get("max_window_layers", int, default=layers) < layers:
            f.fail("max_window_layers", "a per-layer sliding-window pattern is not supported")
    return keys


@reader(("OPTForCausalLM",))
def _opt(f: Fields) -> dict[str, Any]:
    """OPT: LayerNorm before each block (eps 1e-5, torch's default), learned positions, ReLU."""
    hidden, heads = f.get("hidden_size", int), f.get("num_attention_heads", int)
    for key, want in (("activation_function", "relu"), ("do_layer_norm_before", True),
                      ("word_embed_proj_dim", hidden), ("enable_bias", True),
                      ("layer_norm_elementwise_affine", True)):
        if f.config.get(key, want) != want:
            f.fail(key, f"{f.config[key]!r} is not supported (pagebench's OPT has {want!r})")
    return {
        "architecture": "opt", "mlp": "relu", "num_layers": f.get("num_hidden_layers", int),
        "hidden_size": hidden, "num_heads": heads, "num_kv_heads": heads, "head_dim": hidden // heads,
        "intermediate_size": f.get("ffn_dim", int), "vocab_size": f.get("vocab_size", int),
        "max_context": f.get("max_position_embeddings", int), "norm_eps": 1e-5,
        "tied_embeddings": f.get("tie_word_embeddings", bool, default=True), "dtype": dtype_of(f),
    }


# model_type -> reader of its config.json; the layer-group families live in hf_layers.py
FAMILIES = {"llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "opt": _opt, **LAYER_FAMILIES}
