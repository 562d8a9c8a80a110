"""Tensor parallelism: one GPU's weights and KV against hand arithmetic, the all-reduce
time against its formula, the degree chosen and refused, and TP = 1 pricing as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.config.hardware_spec import CostSpec, HardwareSpec
from harness.config.parallelism import (AllReduceCost, allreduce_seconds, replicated_parts,
                                        resolve_tensor_parallel, shard_model)
from harness.config.specs import build_spec
from harness.config.specs import EngineSpec, ModelSpec, kv_capacity_slots
from harness.engine.cost_operator import OperatorCostModel
from harness.errors import ConfigError
from harness.models.hf_config import load_model_spec

CONF = Path(__file__).resolve().parents[1] / "conf"
GIB = 1024**3


def preset(group: str, name: str):
    node = yaml.safe_load((CONF / group / f"{name}.yaml").read_text())
    return load_model_spec(node) if group == "model" else build_spec(HardwareSpec, node, "hardware")


def test_llama_2_70b_on_8_gpus_holds_an_eighth_of_the_weights_and_one_kv_head():
    shard = shard_model(preset("model", "llama-2-70b"), 8)
    hidden, layers = 8192, 80
    # a GPU: 8 query heads and 1 of the 8 KV heads (128 wide), 28672 / 8 = 3584 MLP columns,
    # 32000 / 8 = 4000 vocabulary rows of the embedding and of the LM head
    attention = hidden * 8 * 128 + 2 * hidden * 1 * 128 + 8 * 128 * hidden
    mlp = 3 * hidden * 3584
    params = layers * (attention + mlp) + 2 * 4000 * hidden
    assert shard.num_params == params == 8_621_916_160
    assert shard.weight_bytes == 2 * params
    assert shard.bytes_per_slot == 2 * layers * 1 * 128 * 2 == 40_960  # 1/8 of 327,680
    h100 = preset("hardware", "h100-80gb")
    engine = EngineSpec()
    slots = kv_capacity_slots(shard, h100, engine)
    assert slots == int((80 * GIB * 0.9 - 2 * params - 2 * GIB) // 40_960)


def test_kv_heads_fewer_than_gpus_are_replicated():
    model = preset("model", "llama-2-70b")  # 8 KV heads
    shard = shard_model(model, 16)
    assert (shard.num_heads, shard.num_kv_heads) == (4, 1)
    assert shard.bytes_per_slot == model.bytes_per_slot // 8  # not // 16: one head each
    assert "x2" in replicated_parts(model, 16)[0]


def test_mla_latent_is_kept_whole_on_every_gpu():
    model = preset("model", "deepseek-v3")
    shard = shard_model(model, 8)
    assert shard.bytes_per_slot == model.bytes_per_slot == 61 * 576 * 2
    assert shard.num_heads == 16
    assert "MLA latent KV cache" in replicated_parts(model, 8)


def test_one_gpu_is_the_model_itself():
    model = preset("model", "llama-2-13b")
    assert shard_model(model, 1) is model
    assert AllReduceCost.of(model, preset("hardware", "a100-80gb"), 1) is None


@pytest.mark.parametrize("tp, nbytes", [(2, 0), (8, 16_384), (8, 4 * 2**20), (4, 2**30)])
def test_allreduce_is_the_faster_of_nccls_ring_protocols(tp, nbytes):
    link = 450.0  # GB/s one way
    moved = 2 * (tp - 1) / tp * nbytes
    ll = 6.6e-6 + 2 * (tp - 1) * 0.6e-6 + moved / (min(link / 4, 87.7) * 1e9)
    simple = 8.4e-6 + 2 * (tp - 1) * 3.4e-6 + moved / (link * 1e9)
    assert allreduce_seconds(tp, nbytes, link) == pytest.approx(min(ll, simple), rel=1e-12)
    # small messages: LL's latency wins; a GiB: Simple's bandwidth wins
    assert allreduce_seconds(tp, nbytes, link) == pytest.approx(ll if nbytes <= 2**20 else simple)


def test_a_step_adds_two_allreduces_a_layer_to_the_linear_phase():
    model, h100 = preset("model", "llama-2-70b"), preset("hardware", "h100-80gb")
    shard = shard_model(model, 4)
    cost = CostSpec(kernel_profile="ideal", host_profile="none")
    plain = OperatorCostModel(shard, h100, cost, "paged", 16)
    allreduce = AllReduceCost.of(shard, h100, 4)
    with_tp = OperatorCostModel(shard, h100, cost, "paged", 16, allreduce=allreduce)
    for tokens in (1, 64, 2048):
        base = plain.phases(tokens, 0, 1000 * tokens, tokens, 0, 0, tokens)
        tp = with_tp.phases(tokens, 0, 1000 * tokens, tokens, 0, 0, tokens)
        per = allreduce_seconds(4, tokens * 8192 * 2, 450.0)
        assert tp[0] == base[0] + 160 * per  # 80 layers x 2
        assert tp[1:] == base[1:]
    # a fast-forwarded span prices as the steps one by one
    seconds, columns = with_tp.decode_span(5000, 32, 40)
    singles = [with_tp.phases(32, 0, 5000 + 32 * i + 32, 32, 0, 0, 32) for i in range(40)]
    assert [columns[0]] * 40 == [row[0] for row in singles]  # (linear: one float a span)


@pytest.mark.parametrize("model, hardware, expected", [
    ("llama-2-13b", "a100-80gb", 1),      # fits one GPU: today's run
    ("llama-2-70b", "a100-80gb", 2),      # 128.5 GiB of weights
    ("llama-2-70b", "h200", 2),           # 128.5 GiB of weights > 124.4 GiB usable
    ("qwen3-235b-a22b", "a100-80gb", 8),
    ("gemma-3-27b", "a100-80gb", 2),      # one GPU holds 41,633 slots < 131,072 context
])
def test_auto_picks_the_smallest_power_of_two_that_fits(model, hardware, expected):
    spec = preset("model", model)
    assert resolve_tensor_parallel(spec, preset("hardware", hardware), EngineSpec(),
                                   spec.max_context) == expected


def test_a_model_that_fits_no_nvlink_domain_names_the_degree_it_needs():
    with pytest.raises(ConfigError, match=r"needs tensor_parallel=16 \(79.9 GiB a GPU\)"):
        resolve_tensor_parallel(preset("model", "deepseek-v3"), preset("hardware", "h200"),
                                EngineSpec(), 4096)


def test_an_explicit_degree_too_small_names_the_one_that_fits():
    engine = EngineSpec(tensor_parallel=1)
    with pytest.raises(ConfigError, match=r"engine.tensor_parallel=1: .* set engine.tensor_parallel=2"):
        resolve_tensor_parallel(preset("model", "llama-2-70b"), preset("hardware", "a100-80gb"),
                                engine, 4096)


@pytest.mark.parametrize("tp, hardware, message", [
    (3, "a100-80gb", "64 attention heads do not split 3 ways"),
    (16, "a100-80gb", "more GPUs than one NVLink domain"),
    (2, "cpu", "has no NVLink"),
])
def test_degrees_that_cannot_run_are_refused(tp, hardware, message):
    with pytest.raises(ConfigError, match=message):
        resolve_tensor_parallel(preset("model", "llama-2-70b"), preset("hardware", hardware),
                                EngineSpec(tensor_parallel=tp), 4096)


def test_tp_1_runs_bit_identical_to_no_tensor_parallelism(run_cli, tmp_path):
    """The default run with tensor_parallel=1 and auto (which picks 1) write the same tables."""
    out = {}
    for tp in ("1", "auto"):
        result = run_cli(tmp_path / tp, f"engine.tensor_parallel={tp}", "workload.num_requests=60",
                         "report=false", "progress=false", "jobs=1", "systems=[paged,max]")
        assert result.returncode == 0, result.output
        out[tp] = tmp_path / tp
    for name in ("steps_paged", "requests_paged", "steps_max", "requests_max"):
        assert (out["1"] / f"{name}.csv").read_bytes() == (out["auto"] / f"{name}.csv").read_bytes()
