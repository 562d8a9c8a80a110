"""Layer groups, MLA, experts and KV dtype of conf/model specs, against published figures
and theory (harness/models/model_layers.py)."""

import math
from pathlib import Path

import pytest
import yaml

from harness.config.specs import HardwareSpec, ModelSpec, build_spec, kv_capacity_slots, EngineSpec
from harness.errors import ConfigError
from harness.models.hf_config import load_model_spec

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"


def model(name: str, **overrides) -> ModelSpec:
    node = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    return load_model_spec({**node, **overrides})


# The totals each model's card or paper publishes (parameters, with embeddings).
PUBLISHED_PARAMS = {
    "llama-3.1-70b": 70.6e9, "qwen2.5-7b": 7.61e9, "qwen3-8b": 8.2e9, "qwen3-32b": 32.8e9,
    "qwen3-235b-a22b": 235e9, "mistral-7b": 7.24e9, "gemma-2-9b": 9.24e9, "gemma-2-27b": 27.2e9,
    "gemma-3-27b": 27e9, "deepseek-v3": 671e9, "qwen3-next-80b-a3b": 80e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_weights_match_the_published_totals(name):
    assert model(name).num_params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.015)


def test_flops_count_only_the_routed_experts():
    assert model("qwen3-235b-a22b").active_params == pytest.approx(22e9, rel=0.015)
    assert model("deepseek-v3").active_params == pytest.approx(37e9, rel=0.02)  # 37B activated
    dense = model("qwen3-8b")
    assert dense.active_params == dense.num_params


def test_uniform_models_keep_their_figures():
    # Llama-2-7B: 32 layers x 2 (K, V) x 32 heads x 128 x 2 bytes; 6.74B parameters
    llama = model("llama-2-7b")
    assert llama.bytes_per_slot == 2 * 32 * 32 * 128 * 2 == 524288
    assert llama.num_params == 6_738_149_376
    (group,) = llama.layer_groups
    assert (group.kind, group.num_layers, group.bytes_per_token) == ("full", 32, llama.bytes_per_slot)


def test_mla_bytes_per_token_are_the_latent_and_rope_key():
    spec = model("deepseek-v3")
    (group,) = spec.layer_groups
    assert group.kind == "mla"
    assert group.bytes_per_token == 61 * (512 + 64) * 2  # per layer: (kv_lora_rank + rope) x bf16
    assert spec.bytes_per_slot == group.bytes_per_token
    by_heads = 61 * 2 * 128 * 128 * 2  # K and V of 128 heads of 128
    assert by_heads / spec.bytes_per_slot == pytest.approx(56.9, abs=0.05)


def test_fp8_kv_halves_bytes_and_doubles_capacity():
    bf16, fp8 = model("qwen3-32b"), model("qwen3-32b", kv_dtype="fp8")
    assert fp8.bytes_per_slot * 2 == bf16.bytes_per_slot
    assert fp8.weight_bytes == bf16.weight_bytes
    hw = build_spec(HardwareSpec, yaml.safe_load((CONF.parent / "hardware" / "h200.yaml").read_text()),
                    "hardware")
    engine = build_spec(EngineSpec, {}, "engine")
    slots = kv_capacity_slots(bf16, hw, engine), kv_capacity_slots(fp8, hw, engine)
    assert slots[1] in (2 * slots[0], 2 * slots[0] + 1)
    assert model("deepseek-v3", kv_dtype="fp8").layer_groups[0].bytes_per_token == 61 * 576


def test_gemma_layer_patterns():
    g2 = model("gemma-2-9b").layer_groups
    assert [(g.kind, g.num_layers, g.window) for g in g2] == [("sliding", 21, 4096), ("full", 21, None)]
    g3 = model("gemma-3-27b").layer_groups  # global where (i + 1) % 6 == 0 over 62 layers
    assert [(g.kind, g.num_layers) for g in g3] == [("sliding", 52), ("full", 10)]
    mistral = model("mistral-7b").layer_groups
    assert [(g.kind, g.num_layers, g.window) for g in mistral] == [("sliding", 32, 4096)]


def test_linear_attention_state_is_fixed_per_sequence():
    linear, full = model("qwen3-next-80b-a3b").layer_groups
    assert (linear.kind, linear.num_layers, full.kind, full.num_layers) == ("linear", 36, "full", 12)
    # Gated DeltaNet state: 32 value heads x 128 x 128, conv (4 - 1) x (2 x 16 x 128 + 32 x 128)
    assert linear.state_bytes == 36 * (32 * 128 * 128 + 3 * (2 * 2048 + 4096)) * 2
    assert linear.bytes_for(10) == linear.bytes_for(100_000) == linear.state_bytes
    assert full.bytes_for(1000) == 1000 * 12 * 2 * 2 * 256 * 2


@pytest.mark.parametrize("window,block", [(1024, 16), (100, 16), (7, 3), (8, 3), (32, 32)])
def test_a_window_spans_at_most_ceil_w_over_b_plus_one_blocks(window, block):
    spec = model("mistral-7b", sliding_window=window)
    (group,) = spec.layer_groups
    worst = 0
    for n in range(1, 4 * window + 3 * block):  # tokens [n - W, n) are live after step n
        live = {pos // block for pos in range(max(0, n - window), n)}
        assert len(live) <= group.blocks_for(n, block)
        worst = max(worst, len(live))
    assert worst <= math.ceil(window / block) + 1  # the bound; exact: ceil((W - 1) / b) + 1
    assert worst == math.ceil((window - 1) / block) + 1 == group.blocks_for(10 * window, block)


@pytest.mark.parametrize("overrides,key", [
    ({"kv_dtype": "int3"}, "model.kv_dtype"),
    ({"layer_pattern": ["sliding", "chunked"]}, "model.layer_pattern"),
    ({"sliding_window": 65536}, "model.sliding_window"),
    ({"layer_pattern": ["sliding", "full"], "sliding_window": None}, "model.sliding_window"),
    ({"layer_pattern": ["linear", "full"], "sliding_window": None}, "model.linear_attention"),
    ({"moe": {"num_experts": 8, "experts_per_token": 2, "expert_intermediate_size": 64}}, "model.moe"),
    ({"moe": {"num_experts": 2, "experts_per_token": 4, "expert_intermediate_size": 64},
      "architecture": "qwen3_moe"}, "model.moe.experts_per_token"),
])
def test_bad_layer_keys_are_one_line_errors(overrides, key):
    with pytest.raises(ConfigError) as err:
        model("mistral-7b", **overrides)
    assert str(err.value).startswith(key + ":") and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides,key", [({"kv_dtype": "fp8"}, "model.kv_dtype"),
                                           ({"architecture": "qwen3"}, "model.architecture")])
def test_the_torch_executor_refuses_what_it_does_not_build(overrides, key):
    from harness.engine.model import DecoderModel

    with pytest.raises(ConfigError, match=f"^{key}: the torch executor builds llama, opt"):
        DecoderModel(model("tiny", **overrides))
