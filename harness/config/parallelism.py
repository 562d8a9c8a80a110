"""Tensor parallelism: a model sharded over N GPUs of the hardware profile.

``shard_model(model, N)`` is the model one GPU holds and computes, as vLLM shards it
(Megatron-style column / row parallel layers):

* attention: query heads and the output projection split N ways; KV heads too, as
  ceil(kv_heads / N) a GPU: when kv_heads < N each GPU keeps one KV head (its k/v
  projections and its KV cache are replicated N / kv_heads times; N must divide
  kv_heads or be a multiple of it, as vLLM requires). An MLA layer's latent is one
  shared "head": every GPU keeps the whole latent cache and the down projections
  (q_a, kv_a); the per-head up projections split N ways. A linear-attention layer's
  key and value heads split N ways (its recurrent state with them).
* MLP: the intermediate width splits N ways (every expert's, and the shared
  experts'); the MoE router is replicated.
* embeddings and LM head: the vocabulary splits N ways (VocabParallelEmbedding,
  ParallelLMHead), ceil(vocab / N) rows a GPU (vLLM pads it a little more).
* norms are left out of every model's weights (``harness.models.model_layers``).

Everything per GPU then follows from the shard: weights, FLOPs, KV bytes a token, the
KV capacity (the hardware formula on one GPU's memory), the decode kernel's GQA group.
The GPUs meet twice a layer (after attention's and the MLP's row-parallel projection):
``AllReduceCost`` prices those all-reduces over NVLink (NCCL's ring model). N = 1 returns the model itself.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from harness.config.hardware_spec import HardwareSpec
from harness.errors import ConfigError
from harness.models.model_spec import ModelSpec

GIB = 1024**3
# NCCL's cost model of a ring all-reduce inside one NVLink domain (NVIDIA/nccl
# src/graph/tuning.cc, ncclTopoTuneModel), for its two ring protocols; NCCL runs the one
# its model prices faster, as here:
#   latency = baseLat + 2 (N - 1) x hwLat[NVLink]; bus bandwidth = the link's for Simple, a
#   quarter of it for LL, at most llMaxBw (87.7 GB/s on Ampere and Hopper, one node).
# (protocol, baseLat s, hwLat s, share of the link's bandwidth, cap in GB/s)
NCCL_RING_PROTOCOLS = (("LL", 6.6e-6, 0.6e-6, 0.25, 87.7),
                       ("Simple", 8.4e-6, 3.4e-6, 1.0, None))
# All-reduces a transformer layer does: after attention's output projection and after
# the MLP's down projection (both row-parallel).
ALLREDUCES_PER_LAYER = 2


def shard_model(model: ModelSpec, tp: int) -> ModelSpec:
    """The part of ``model`` one of ``tp`` GPUs holds (the module docstring); ``model``
    itself for ``tp`` = 1. ``check_shardable`` first."""
    if tp == 1:
        return model

    def split(n: int) -> int:
        return -(-n // tp)

    changes = {"num_heads": model.num_heads // tp,
               "num_kv_heads": split(model.num_kv_heads),
               "intermediate_size": split(model.intermediate_size),
               "vocab_size": split(model.vocab_size)}
    if model.moe is not None:
        changes["moe"] = dataclasses.replace(
            model.moe, expert_intermediate_size=split(model.moe.expert_intermediate_size),
            shared_expert_intermediate_size=split(model.moe.shared_expert_intermediate_size))
    if model.linear_attention is not None:
        la = model.linear_attention
        changes["linear_attention"] = dataclasses.replace(
            la, num_key_heads=la.num_key_heads // tp, num_value_heads=la.num_value_heads // tp)
    return dataclasses.replace(model, **changes)


def shard_problem(model: ModelSpec, tp: int) -> str | None:
    """Why ``model`` cannot be split over ``tp`` GPUs (vLLM's rules), or None."""
    if model.num_heads % tp:
        return f"its {model.num_heads} attention heads do not split {tp} ways"
    kv = model.num_kv_heads
    if model.mla is None and (kv % tp if kv >= tp else tp % kv):
        return (f"its {kv} KV heads neither split {tp} ways nor replicate evenly over "
                f"{tp} GPUs")
    la = model.linear_attention
    if la is not None and (la.num_key_heads % tp or la.num_value_heads % tp):
        return (f"its linear-attention heads ({la.num_key_heads} key, {la.num_value_heads} "
                f"value) do not split {tp} ways")
    return None


def replicated_parts(model: ModelSpec, tp: int) -> list[str]:
    """The weights and KV every one of ``tp`` GPUs keeps whole (results.json says which)."""
    if tp == 1:
        return []
    parts = []
    if model.mla is not None:
        parts += ["MLA latent KV cache", "MLA down projections (q_a, kv_a)"]
    elif model.num_kv_heads < tp:
        parts += [f"KV heads ({model.num_kv_heads} over {tp} GPUs: k/v projections and KV "
                  f"cache x{tp // model.num_kv_heads})"]
    if model.moe is not None:
        parts.append("MoE router")
    return parts


def check_tensor_parallel(model: ModelSpec, hardware: HardwareSpec, tp: int) -> None:
    """``ConfigError`` naming engine.tensor_parallel when ``tp`` GPUs cannot run ``model``."""
    if tp == 1:
        return
    if hardware.nvlink_gbps is None:
        raise ConfigError(f"engine.tensor_parallel={tp}: hardware={hardware.name} has no NVLink "
                          "(hardware.nvlink_gbps is null); use a GPU profile (a100-80gb, h100-80gb, "
                          "h200) or tensor_parallel=1")
    if tp > hardware.nvlink_gpus:
        raise ConfigError(f"engine.tensor_parallel={tp}: more GPUs than one NVLink domain of "
                          f"hardware={hardware.name} joins (nvlink_gpus={hardware.nvlink_gpus}); "
                          "tensor parallelism across nodes is not modelled")
    problem = shard_problem(model, tp)
    if problem is not None:
        raise ConfigError(f"engine.tensor_parallel={tp}: {model.name} cannot be sharded: {problem}")
    if hardware.fitted is not None and hardware.fitted.applies_to(model):
        raise ConfigError(f"engine.tensor_parallel={tp}: hardware={hardware.name}'s calibrated fit "
                          f"was measured on one GPU running {model.name}; use tensor_parallel=1")


def degree(engine) -> int:
    """``engine.tensor_parallel`` as run_setup resolved it; an unresolved ``auto`` (a spec
    built without ``run_setup``, as tests and tools do) is one GPU."""
    return engine.tensor_parallel if isinstance(engine.tensor_parallel, int) else 1


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit``."""
    return [1 << i for i in range(max(limit, 1).bit_length()) if 1 << i <= limit]


def allreduce_seconds(tp: int, nbytes: float, link_gbps: float) -> float:
    """One ring all-reduce of ``nbytes`` over ``tp`` GPUs: each GPU sends (and receives)
    2 (N - 1) / N x bytes at the protocol's bus bandwidth, after its ring latency; the
    faster of NCCL's LL and Simple protocols (``NCCL_RING_PROTOCOLS``)."""
    best = None
    for _, base_s, hop_s, share, cap_gbps in NCCL_RING_PROTOCOLS:
        gbps = link_gbps * share if cap_gbps is None else min(link_gbps * share, cap_gbps)
        seconds = base_s + 2 * (tp - 1) * hop_s + 2 * (tp - 1) / tp * nbytes / (gbps * 1e9)
        if best is None or seconds < best:
            best = seconds
    return best


@dataclass(frozen=True)
class AllReduceCost:
    """A step's all-reduces on ``tp`` GPUs: ``ALLREDUCES_PER_LAYER`` a layer, each of the
    step's tokens' hidden states (tokens x hidden x dtype bytes), ``allreduce_seconds``
    each."""

    tp: int
    count: int  # all-reduces a step
    token_bytes: int  # a token's hidden state
    link_gbps: float

    @classmethod
    def of(cls, model: ModelSpec, hardware: HardwareSpec, tp: int) -> "AllReduceCost | None":
        """None for ``tp`` = 1 (no term at all: the steps price as without TP)."""
        if tp == 1:
            return None
        return cls(tp, ALLREDUCES_PER_LAYER * model.layers, model.hidden_size * model.dtype_bytes,
                   hardware.nvlink_gbps)

    def seconds(self, tokens: int) -> float:
        """The step's all-reduces for ``tokens`` batched tokens."""
        return self.count * allreduce_seconds(self.tp, tokens * self.token_bytes, self.link_gbps)


def resolve_tensor_parallel(model: ModelSpec, hardware: HardwareSpec, engine,
                            max_model_len: int) -> int:
    """``engine.tensor_parallel`` as a number of GPUs: the given one, checked (a model that
    does not fit is refused naming the degree that fits), or for ``auto`` the smallest
    power of two up to the NVLink domain whose GPUs hold the weights and one
    ``max_model_len`` sequence's KV (vLLM's start-up check), else the smallest whose
    weights fit, else a refusal naming the degree that would fit."""
    from harness.config.specs import kv_capacity_slots

    usable = (hardware.memory_gib * engine.gpu_memory_utilization
              - engine.activation_reserve_gib) * GIB

    def capacity(tp: int) -> int | None:
        """One GPU's KV slots on ``tp`` GPUs, None when its weights leave no slot."""
        if shard_problem(model, tp) is not None:
            return None
        shard = shard_model(model, tp)
        if usable - shard.weight_bytes < shard.bytes_per_slot:
            return None
        return kv_capacity_slots(shard, hardware, engine)

    requested = engine.tensor_parallel
    if requested != "auto":
        check_tensor_parallel(model, hardware, requested)
        if engine.kv_capacity_slots is None and capacity(requested) is None:
            raise ConfigError(_no_fit(model, hardware, engine, requested))
        return requested
    if engine.kv_capacity_slots is not None:
        return 1  # an explicit pool: the paper's setups size it, one GPU
    limit = hardware.nvlink_gpus if hardware.nvlink_gbps is not None else 1
    if hardware.fitted is not None and hardware.fitted.applies_to(model):
        limit = 1
    fits = {tp: capacity(tp) for tp in powers_of_two(limit)}
    for tp, slots in fits.items():
        if slots is not None and slots >= max_model_len:
            return tp
    for tp, slots in fits.items():
        if slots is not None:
            return tp
    raise ConfigError(_no_fit(model, hardware, engine, "auto"))


def _no_fit(model: ModelSpec, hardware: HardwareSpec, engine, requested) -> str:
    """The refusal of a model whose weights leave no KV memory on ``requested`` GPUs, naming
    the smallest power-of-two degree whose GPUs would hold them."""
    usable = hardware.memory_gib * engine.gpu_memory_utilization - engine.activation_reserve_gib
    need = next((tp for tp in powers_of_two(1024) if shard_problem(model, tp) is None
                 and shard_model(model, tp).weight_bytes / GIB < usable), None)
    where = (f"engine.tensor_parallel={requested}" if requested != "auto"
             else "engine.tensor_parallel=auto")
    shard_tp = requested if requested != "auto" else 1
    shard = shard_model(model, shard_tp)
    head = (f"{where}: model={model.name} does not fit hardware={hardware.name}: "
            f"{shard.weight_bytes / GIB:,.1f} GiB of weights a GPU at tensor_parallel={shard_tp} "
            f"against {usable:,.1f} GiB usable ({hardware.memory_gib} GiB x "
            f"engine.gpu_memory_utilization={engine.gpu_memory_utilization} - "
            f"engine.activation_reserve_gib="
            f"{engine.activation_reserve_gib})")
    if need is None:
        return head + "; no tensor-parallel degree holds them: choose a larger hardware profile"
    per_gpu = shard_model(model, need).weight_bytes / GIB
    domain = hardware.nvlink_gpus if hardware.nvlink_gbps is not None else 1
    if need <= domain:
        return (f"{head}. It fits tensor_parallel={need} ({per_gpu:,.1f} GiB a GPU): set "
                f"engine.tensor_parallel={need}")
    return (f"{head}. It needs tensor_parallel={need} ({per_gpu:,.1f} GiB a GPU), more GPUs than "
            f"one NVLink domain of {hardware.name} joins ({domain}): choose a larger hardware "
            "profile (or set engine.kv_capacity_slots to size the pool yourself)")


def gpu_memory(full: ModelSpec, shard: ModelSpec, hardware: HardwareSpec, engine, tp: int,
               capacity_slots: int) -> dict:
    """results.json's ``parallelism``: the degree, the replicas and router, and one GPU's
    memory (weights, KV pool, activation reserve, in GiB) with what every GPU replicates."""
    return {
        "tensor_parallel": tp, "replicas": engine.replicas, "router": engine.router,
        "gpus": tp * engine.replicas,
        "per_gpu": {
            "memory_gib": hardware.memory_gib,
            "usable_gib": round(hardware.memory_gib * engine.gpu_memory_utilization, 3),
            "weights_gib": round(shard.weight_bytes / GIB, 3),
            "kv_cache_gib": round(capacity_slots * shard.bytes_per_slot / GIB, 3),
            "activation_reserve_gib": engine.activation_reserve_gib,
            "kv_bytes_per_slot": shard.bytes_per_slot,
            "num_heads": shard.num_heads, "num_kv_heads": shard.num_kv_heads,
        },
        "replicated": replicated_parts(full, tp),
        "allreduce": None if tp == 1 else {
            "per_step": ALLREDUCES_PER_LAYER * shard.layers, "nvlink_gbps": hardware.nvlink_gbps,
            "decode_step_s_at_batch": {str(b): AllReduceCost.of(shard, hardware, tp).seconds(b)
                                       for b in (1, 64, 256)}},
    }
