"""Hugging Face checkpoints run as transformers runs them.

Tiny random checkpoints of each supported family are built with ``transformers`` and saved
to a temporary directory (the Llama one sharded, with its index); pagebench loads them
through ``model=hf model.path=DIR`` and must match the reference implementation: logits
within float32 tolerance, and greedy generation of 32 tokens identical to transformers'
greedy choice (each token the argmax of its forward over the tokens before it) on every
system: paged with block sizes 1 and 16, prefix caching on and off, max, oracle, and after
preemption by recompute and by swap; with chunked prefill; and on the float32 path
(``engine.batch_invariant=false``: the prefill and decode kernels' torch references).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from harness.config.specs import ModelSpec
from harness.engine.model import DecoderModel
from harness.errors import ConfigError, InputError
from harness.models.hf_config import load_model_spec
from torch_helpers import contiguous, engine, one_torch_thread, paged, run_torch  # noqa: F401
from harness.workloads.request import Request

transformers = pytest.importorskip("transformers")

VOCAB = 256
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
FAMILIES = ("llama", "mistral", "qwen2", "opt")
OUTPUT_LEN = 32


def _reference_model(family: str):
    t = transformers
    if family == "llama":  # Llama-3.1's rotary settings, at a scale where they matter
        return t.LlamaForCausalLM(t.LlamaConfig(**COMMON, rope_theta=500_000.0,
                                                rope_scaling=LLAMA3_SCALING))
    if family == "mistral":  # a window shorter than the prompts
        return t.MistralForCausalLM(t.MistralConfig(**COMMON, sliding_window=24))
    if family == "qwen2":  # q/k/v biases, tied embeddings
        return t.Qwen2ForCausalLM(t.Qwen2Config(**COMMON, tie_word_embeddings=True))
    return t.OPTForCausalLM(t.OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        max_position_embeddings=512, word_embed_proj_dim=64))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{family: (directory, transformers model)}; norms and biases perturbed so they matter."""
    out = {}
    torch.manual_seed(0)
    for family in FAMILIES:
        model = _reference_model(family).eval()
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() == 1:
                    param.add_(torch.randn_like(param) * 0.2)
        directory = tmp_path_factory.mktemp(family)
        model.save_pretrained(directory, max_shard_size="100KB" if family == "llama" else "1GB")
        out[family] = (directory, model)
    return out


def _spec(directory) -> ModelSpec:
    return load_model_spec({"name": None, "path": str(directory), "dtype": None})


def test_llama_checkpoint_is_sharded_and_read_from_its_config(checkpoints):
    directory, _ = checkpoints["llama"]
    assert len(json.loads((directory / "model.safetensors.index.json").read_text())
               ["weight_map"]) == 2 + 2 * 9 + 1  # embed, lm_head, 9 per layer, norm
    spec = _spec(directory)
    assert (spec.rope_theta, spec.rope_scaling.type, spec.rope_scaling.factor) == (500_000.0, "llama3", 8.0)
    assert (spec.num_kv_heads, spec.head_dim, spec.dtype, spec.architecture) == (2, 16, "float32", "llama")
    assert _spec(checkpoints["mistral"][0]).sliding_window == 24
    qwen = _spec(checkpoints["qwen2"][0])
    assert qwen.attention_bias and qwen.tied_embeddings
    assert _spec(checkpoints["opt"][0]).architecture == "opt"
    half = load_model_spec({"path": str(directory / "config.json"), "dtype": "bfloat16",
                            "num_layers_override": 1})
    assert (half.dtype, half.layers) == ("bfloat16", 1)


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["fast", "float64"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(checkpoints, family, batch_invariant):
    directory, reference = checkpoints[family]
    ids = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]  # [60, vocab]
    ours = DecoderModel(_spec(directory), batch_invariant=batch_invariant)
    torch.testing.assert_close(ours.dense_logits(ids), expected, rtol=1e-4, atol=1e-4)


def test_sliding_window_and_rope_scaling_change_the_logits(checkpoints):
    """The reference agrees with them (above, within 1e-4), and without them the logits
    differ by ten times that."""
    import dataclasses

    ids = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(2))
    for family, change in (("mistral", {"sliding_window": None}), ("llama", {"rope_scaling": None})):
        spec = _spec(checkpoints[family][0])
        full, changed = DecoderModel(spec), DecoderModel(dataclasses.replace(spec, **change))
        assert (full.dense_logits(ids) - changed.dense_logits(ids)).abs().max() > 1e-3


def _workload() -> tuple[Request, ...]:
    """Four prompts, two sharing a 20-token prefix; the later ones arrive after the first step."""
    rng = np.random.default_rng(3)
    prefix = rng.integers(0, VOCAB, 20, dtype=np.int32)
    prompts = [np.concatenate([prefix, rng.integers(0, VOCAB, 9, dtype=np.int32)]),
               rng.integers(0, VOCAB, 17, dtype=np.int32),
               np.concatenate([prefix, rng.integers(0, VOCAB, 14, dtype=np.int32)]),
               rng.integers(0, VOCAB, 40, dtype=np.int32)]
    out = []
    for i, ids in enumerate(prompts):
        ids.flags.writeable = False
        out.append(Request(i, 0.0 if i < 2 else 1e-6, ids, OUTPUT_LEN))
    return tuple(out)


def _assert_greedy_under(model, requests, tokens) -> None:
    """Each generated token is the argmax of transformers' forward over the tokens before it:
    what greedy decoding with transformers generates (one forward per request)."""
    for request in requests:
        generated = tokens[request.request_id][0]
        assert len(generated) == OUTPUT_LEN
        ids = torch.as_tensor(np.concatenate([request.prompt_token_ids, generated]), dtype=torch.long)
        with torch.no_grad():
            logits = model(ids[None]).logits[0]  # [prompt + output, vocab]
        start = len(request.prompt_token_ids)
        assert logits[start - 1:-1].argmax(dim=-1).tolist() == generated


SYSTEMS = {
    "paged1": lambda: (paged(1), engine()),
    "paged16": lambda: (paged(16), engine()),
    "paged1_prefix": lambda: (paged(1, prefix_caching=True), engine()),
    "paged16_prefix": lambda: (paged(16, prefix_caching=True), engine()),
    "max": lambda: (contiguous("max"), engine()),
    "oracle": lambda: (contiguous("oracle"), engine()),
    "paged16_recompute": lambda: (paged(16, prefix_caching=True), engine(kv_capacity_slots=128)),
    "paged16_swap": lambda: (paged(16), engine(kv_capacity_slots=128, preemption="swap")),
    # chunked prefill: later chunks read the earlier ones' KV from the cache
    "paged16_chunked": lambda: (paged(16, prefix_caching=True),
                                engine(chunked_prefill=True, max_num_batched_tokens=12)),
    # the float32 path: prefill_attention and the decode kernels' torch reference
    "paged16_prefix_fp32": lambda: (paged(16, prefix_caching=True), engine(batch_invariant=False)),
    "oracle_fp32": lambda: (contiguous("oracle"), engine(batch_invariant=False)),
}


@pytest.fixture(scope="module")
def reference_tokens(checkpoints):
    """{family: the oracle's tokens}, checked against transformers' greedy choice."""
    out = {}
    for family, (directory, model) in checkpoints.items():
        result = run_torch(_workload(), contiguous("oracle"), engine(), model=_spec(directory))
        _assert_greedy_under(model, _workload(), result.tokens)
        out[family] = result.tokens
    return out


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches_transformers(checkpoints, reference_tokens, family, system):
    spec_system, spec_engine = SYSTEMS[system]()
    result = run_torch(_workload(), spec_system, spec_engine, model=_spec(checkpoints[family][0]))
    assert result.run.rejected == {} and result.run.complete
    assert result.tokens == reference_tokens[family]
    if system.endswith(("recompute", "swap")):
        assert result.scheduler.num_preemptions > 0
    if system.endswith("swap"):
        assert result.scheduler.num_swaps > 0
    if system.endswith("chunked"):  # every prompt (17..40 tokens) ran in chunks of <= 12
        assert max(step.num_tokens for step in result.executor.step_log) <= 12
    if system.endswith("prefix"):
        assert result.scheduler.prompt_tokens_cached > 0


def test_missing_files_and_unsupported_architectures_are_one_line_errors(checkpoints, tmp_path):
    with pytest.raises(ConfigError, match=r"model.path=.*: no .*config.json"):
        load_model_spec({"path": str(tmp_path)})
    directory = checkpoints["qwen2"][0]
    config = json.loads((directory / "config.json").read_text())
    broken = tmp_path / "broken"
    broken.mkdir()
    for change, match in (({"model_type": "gpt2"}, "field 'model_type': 'gpt2' is not supported"),
                          ({"hidden_act": "gelu"}, "field 'hidden_act'"),
                          ({"num_hidden_layers": None}, "field 'num_hidden_layers'")):
        (broken / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(InputError, match=match) as info:
            load_model_spec({"path": str(broken)})
        assert str(info.value).startswith(str(broken / "config.json")) and "\n" not in str(info.value)
    del config["vocab_size"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="field 'vocab_size': missing"):
        load_model_spec({"path": str(broken)})
    (broken / "config.json").write_text((directory / "config.json").read_text())
    with pytest.raises(ConfigError, match="model.safetensors is missing"):
        DecoderModel(_spec(broken))
    with pytest.raises(ConfigError, match="model.hidden_size: comes from the checkpoint"):
        load_model_spec({"path": str(directory), "hidden_size": 8})
    with pytest.raises(ConfigError, match="model.max_context=4096: the checkpoint's max_position"):
        load_model_spec({"path": str(directory), "max_context": 4096})
    with pytest.raises(ConfigError, match="model.path: model=hf needs a checkpoint directory"):
        load_model_spec({"name": None, "path": None})


def test_every_model_yaml_states_its_architecture_and_rotary_settings():
    from pathlib import Path

    import yaml

    from harness.config.specs import build_spec
    from harness.models.model_spec import ARCHITECTURES

    conf = Path(__file__).resolve().parents[1] / "conf" / "model"
    for path in conf.glob("*.yaml"):
        node = yaml.safe_load(path.read_text())
        if path.stem == "hf":  # everything comes from the checkpoint
            continue
        assert node["architecture"] in ARCHITECTURES, path  # (the torch executor builds TORCH_ARCHITECTURES)
        build_spec(ModelSpec, node, "model")
    llama31 = build_spec(ModelSpec, yaml.safe_load((conf / "llama-3.1-8b.yaml").read_text()), "model")
    assert llama31.rope_theta == 500_000.0  # meta-llama/Llama-3.1-8B config.json
    assert (llama31.rope_scaling.type, llama31.rope_scaling.factor,
            llama31.rope_scaling.original_max_position_embeddings) == ("llama3", 8.0, 8192)
    opt = build_spec(ModelSpec, yaml.safe_load((conf / "opt-13b.yaml").read_text()), "model")
    assert (opt.architecture, opt.mlp) == ("opt", "relu")
