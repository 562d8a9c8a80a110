"""config.json files of layer-group families (written here, in the published models'
values) read into the same specs as their conf/model YAMLs (harness/models/hf_layers.py)."""

import json
from pathlib import Path

import pytest
import yaml

from harness.errors import ConfigError, InputError
from harness.models.hf_config import load_model_spec

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_act": "silu",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 129280,
}
GEMMA_2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "sliding_window": 4096,
    "torch_dtype": "float32", "vocab_size": 256000,
}
GEMMA_3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text", "head_dim": 128, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 5376, "intermediate_size": 21504, "max_position_embeddings": 131072,
        "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
        "rms_norm_eps": 1e-6, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "rope_theta": 1000000.0, "sliding_window": 1024, "sliding_window_pattern": 6,
        "vocab_size": 262208,
    },
}
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "decoder_sparse_step": 1,
    "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "moe_intermediate_size": 512,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10,
    "num_hidden_layers": 48, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
    "rope_theta": 10000000, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 151936,
}
QWEN3_235B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 12288, "max_position_embeddings": 40960, "mlp_only_layers": [],
    "moe_intermediate_size": 1536, "num_attention_heads": 64, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 94, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
}


def write(tmp_path: Path, config: dict, name: str = "ckpt") -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def from_yaml(name: str):
    return load_model_spec(yaml.safe_load((CONF / f"{name}.yaml").read_text()))


@pytest.mark.parametrize("config,name", [
    (DEEPSEEK_V3, "deepseek-v3"), (GEMMA_2_9B, "gemma-2-9b"), (GEMMA_3_27B, "gemma-3-27b"),
    (QWEN3_NEXT, "qwen3-next-80b-a3b"), (QWEN3_235B, "qwen3-235b-a22b"),
])
def test_config_json_gives_the_yaml_spec(tmp_path, config, name):
    spec = load_model_spec({"path": write(tmp_path, config), "dtype": "bfloat16"})
    want = from_yaml(name)
    assert spec.layer_groups == want.layer_groups
    assert (spec.num_params, spec.active_params, spec.bytes_per_slot) == (
        want.num_params, want.active_params, want.bytes_per_slot)
    assert (spec.architecture, spec.mla, spec.moe, spec.linear_attention) == (
        want.architecture, want.mla, want.moe, want.linear_attention)


def test_layer_types_give_the_pattern_and_kv_dtype_is_set_beside_the_path(tmp_path):
    types = ["sliding_attention"] * 5 + ["full_attention"]
    config = {**GEMMA_3_27B, "text_config": {**GEMMA_3_27B["text_config"], "num_hidden_layers": 12,
                                             "layer_types": types * 2}}
    spec = load_model_spec({"path": write(tmp_path, config), "kv_dtype": "fp8"})
    assert spec.layer_pattern == ("sliding",) * 5 + ("full",)
    hash(spec)  # the torch executor caches models by spec
    assert [(g.kind, g.num_layers, g.bytes_per_token) for g in spec.layer_groups] == [
        ("sliding", 10, 10 * 2 * 16 * 128), ("full", 2, 2 * 2 * 16 * 128)]  # fp8: 1 byte


@pytest.mark.parametrize("config,field", [
    ({**DEEPSEEK_V3, "kv_lora_rank": None}, "kv_lora_rank"),
    ({k: v for k, v in DEEPSEEK_V3.items() if k != "qk_rope_head_dim"}, "qk_rope_head_dim"),
    ({k: v for k, v in QWEN3_235B.items() if k != "num_experts_per_tok"}, "num_experts_per_tok"),
    ({**QWEN3_235B, "mlp_only_layers": [3]}, "mlp_only_layers"),
    ({**QWEN3_NEXT, "layer_types": ["linear_attention", "chunked_attention"] * 24}, "layer_types"),
    ({**QWEN3_NEXT, "layer_types": ["full_attention"] * 47}, "layer_types"),
    ({k: v for k, v in GEMMA_2_9B.items() if k != "sliding_window"}, "sliding_window"),
    ({**GEMMA_3_27B, "text_config": {k: v for k, v in GEMMA_3_27B["text_config"].items()
                                     if k != "head_dim"}}, "text_config.head_dim"),
])
def test_missing_or_unsupported_fields_name_the_field(tmp_path, config, field):
    with pytest.raises(InputError) as err:
        load_model_spec({"path": write(tmp_path, config)})
    message = str(err.value)
    assert f"field {field!r}" in message and "config.json" in message and "\n" not in message


def test_a_window_larger_than_the_context_is_refused(tmp_path):
    config = {**GEMMA_2_9B, "sliding_window": 16384}
    with pytest.raises(ConfigError, match=r"^model.sliding_window: 16384 is larger than the context"):
        load_model_spec({"path": write(tmp_path, config)})
