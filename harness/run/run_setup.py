"""The run plan: the specs a run builds from its config, every one checked, before any work.

``run_setup(cfg)`` builds the model, hardware and engine specs, the block size, the seed,
``max_model_len`` and the systems, and parses the workload's spec (no request is generated
and no trace is read; the device is not touched). A serving run (``harness.run.serve``), each job
of a study (``harness.studies``) and ``python -m harness``'s check before it sets an
earlier run's outputs aside all build them here, so they refuse the same configs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from harness.config.cli_args import check_seed
from harness.config.specs import (GIB, MAX_KV_SLOTS, EngineSpec, HardwareSpec, ModelSpec, SloSpec, SystemSpec,
                            build_spec, select_systems, validate_block_size)
from harness.config.specs import REQUIRED_KEYS, to_plain
from harness.engine.executors import check_cost_profiles
from harness.errors import ConfigError
from harness.config.parallelism import resolve_tensor_parallel, shard_model


@dataclass(frozen=True)
class RunSetup:
    """A run's checked specs."""

    model: ModelSpec
    hardware: HardwareSpec
    engine: EngineSpec
    block_size: int
    seed: int
    max_model_len: int
    systems: list[SystemSpec]
    slo: SloSpec = SloSpec()  # the latency targets goodput counts against
    # the model as configured; ``model`` is the part one GPU holds (the same object
    # without tensor parallelism, harness.config.parallelism)
    full_model: ModelSpec | None = None


def run_setup(cfg: Any, systems: list[str] | None = None) -> RunSetup:
    """The specs of ``cfg`` (a composed config or its plain dict), for its ``systems`` or
    the given ones; raises ``ConfigError`` naming the key at fault."""
    from harness.models.hf_config import load_model_spec
    from harness.config.memory_estimate import check_run_fits
    from harness.workloads.build import parse_workload

    missing = [key for key in REQUIRED_KEYS if key not in cfg and (key != "systems" or not systems)]
    if missing:
        raise ConfigError(f"{missing[0]}: missing from the config, and every run reads it: set it "
                          f"({missing[0]}=...)")
    # the composed config stops here: what the specs are built from, as plain values
    node = {key: to_plain(cfg[key]) for key in (*REQUIRED_KEYS, "slo") if key in cfg}
    model = load_model_spec(node["model"])
    hardware = build_spec(HardwareSpec, node["hardware"], "hardware")
    engine = build_spec(EngineSpec, node["engine"], "engine")
    block_size = validate_block_size(node["block_size"])
    slo = build_spec(SloSpec, node.get("slo"), "slo")
    seed = check_seed(node["seed"])
    max_swap_gib = MAX_KV_SLOTS * model.bytes_per_slot / GIB
    if engine.swap_space_gib > max_swap_gib:  # (1e30 overflowed building the CPU pool)
        raise ConfigError(f"engine.swap_space_gib: at most {max_swap_gib:,.0f} GiB for "
                          f"{model.name} ({MAX_KV_SLOTS:,} slots: slot numbers are int32), "
                          f"got {engine.swap_space_gib!r}")
    max_model_len = engine.max_model_len or model.max_context
    if max_model_len > model.max_context:
        raise ConfigError(f"engine.max_model_len={max_model_len} exceeds {model.name}'s context "
                          f"of {model.max_context}")
    if not engine.chunked_prefill and engine.max_num_batched_tokens < max_model_len:
        raise ConfigError(
            f"engine.max_num_batched_tokens={engine.max_num_batched_tokens} is below max_model_len="
            f"{max_model_len}, so a long prompt could never be scheduled: raise "
            f"engine.max_num_batched_tokens, lower engine.max_model_len, or set "
            "engine.chunked_prefill=true")
    full_model, engine = model, check_engine_parallelism(engine)
    tp = resolve_tensor_parallel(model, hardware, engine, max_model_len)
    engine = dataclasses.replace(engine, tensor_parallel=tp)
    model = shard_model(model, tp)  # the model itself for tp = 1
    specs = select_systems(node["systems"] if systems is None else systems, node["allocator"],
                           block_size)
    check_systems_for_model(specs, model)
    check_systems_for_engine(specs, engine)
    check_offload(engine, specs, model)  # engine.offload: paged + prefix cache, sim, >= 1 block
    check_run_fits(parse_workload(node["workload"])[1])  # 10^9 requests: refused, not OOM-killed
    check_cost_profiles(engine, specs, model, hardware)  # the profile files, read and checked
    return RunSetup(model, hardware, engine, block_size, seed, max_model_len, specs, slo,
                    full_model)


def check_engine_parallelism(engine: EngineSpec) -> EngineSpec:
    """Tensor parallelism and replicas are the sim's, priced by the operator cost model:
    engine=torch runs one engine on one device, and the roofline has no all-reduce term."""
    if engine.executor == "torch":
        for key, one in (("tensor_parallel", 1), ("replicas", 1)):
            value = getattr(engine, key)
            if value not in (one, "auto"):
                raise ConfigError(f"engine.{key}={value}: the torch executor runs one engine on "
                                  f"one device; set engine.{key}={one} or use engine=sim")
        return dataclasses.replace(engine, tensor_parallel=1)
    if engine.replicas > 1 and engine.offload.enabled:
        raise ConfigError(f"engine.replicas={engine.replicas}: the offload tiers are modelled for "
                          "one engine; set engine.replicas=1 or engine.offload.cpu_gib=0")
    if engine.cost.model == "roofline" and engine.tensor_parallel not in (1, "auto"):
        raise ConfigError(f"engine.tensor_parallel={engine.tensor_parallel}: the all-reduces are "
                          "priced by the operator cost model; set engine.cost.model=operator")
    if engine.cost.model == "roofline":
        return dataclasses.replace(engine, tensor_parallel=1)
    return engine


def check_systems_for_model(systems: list[SystemSpec], model: ModelSpec) -> None:
    """What a system's manager cannot do with this model (e.g. a page smaller than a token)."""
    from pagebench.allocators.registry import MANAGERS
    for system in systems:
        problem = MANAGERS[system.kind].system_problem(system, model)
        if problem is not None:
            raise ConfigError(f"allocator.{system.name}.{problem[0]}: {problem[1]}")


def check_systems_for_engine(systems: list[SystemSpec], engine: EngineSpec) -> None:
    """engine=torch lays KV out as its managers declare: a system without a tensor layout
    is refused here, before any system runs (the executor would refuse it only when built)."""
    from pagebench.allocators.registry import MANAGERS
    if engine.executor != "torch":
        return
    for system in systems:
        if MANAGERS[system.kind].tensor_layout == "none":
            raise ConfigError(f"systems: {system.name} ({system.kind}) has no KV tensor layout for "
                              "engine=torch; run it with engine=sim or leave it out of systems")


def check_offload(engine: EngineSpec, systems: list[SystemSpec], model: ModelSpec) -> None:
    """With ``engine.offload`` on: every system is a paged manager with prefix caching, the
    executor is the sim, and each tier holds at least one block. Raises ``ConfigError``."""
    spec = engine.offload
    if not spec.enabled:
        return
    if engine.executor != "sim":
        raise ConfigError("engine.offload.cpu_gib: the offload tier is modelled by the sim "
                          "executor only; run it with engine=sim (or set engine.offload.cpu_gib=0)")
    for system in systems:
        if system.kind != "paged" or not system.prefix_caching:
            raise ConfigError(
                f"engine.offload.cpu_gib: system {system.name} ({system.kind}"
                f"{'' if system.kind != 'paged' else ', no prefix cache'}) has no block prefix "
                "cache to offload; run only paged systems with prefix_caching (e.g. "
                "systems=[paged]) or set engine.offload.cpu_gib=0")
        block_bytes = system.block_size * model.bytes_per_slot
        for key in ("cpu_gib", "disk_gib"):
            gib = getattr(spec, key)
            if gib and gib * GIB < block_bytes:
                raise ConfigError(
                    f"engine.offload.{key}: {gib} GiB is smaller than one KV block of "
                    f"{system.name} ({system.block_size} tokens x {model.bytes_per_slot:,} bytes "
                    f"= {block_bytes:,} bytes for {model.name}); give at least "
                    f"{block_bytes / GIB:.6g} GiB, or 0 for no tier")


def check_block_sizes(systems: list[SystemSpec], capacity: int) -> None:
    """A paged system's block must fit in the KV pool of ``capacity`` slots."""
    for system in systems:
        if system.kind == "paged" and capacity // system.block_size < 1:
            raise ConfigError(f"block_size={system.block_size} is larger than the whole KV pool "
                              f"({capacity} slots)")
