"""Typed, validated views of the Hydra config.

Hydra composes YAML; these frozen specs are what the code uses. ``build_spec`` checks a
whole node against its spec's schema in one pass (``harness.spec_schema``, on pydantic) and
rejects unknown keys and invalid values with a ``ConfigError`` that names the key
(``engine.max_num_seqs``) and says how to fix it; nothing downstream checks them again.

The specs live in their own modules (``harness.models.model_spec``,
``harness.config.hardware_spec``, ``harness.config.offload``); this module keeps the engine
and system specs, the run options and the capacity, and re-exports the rest.
"""

from __future__ import annotations

import re
from dataclasses import field
from typing import Annotated, Any, Mapping

from pydantic import AfterValidator, BeforeValidator, Field, Strict, WrapValidator, model_validator

from harness.config.hardware_spec import CostSpec, FittedCostSpec, HardwareSpec
from harness.config.offload import OffloadSpec
from harness.errors import ConfigError, did_you_mean
from harness.models.model_layers import (LayerGroup, LinearAttentionSpec, MlaSpec, MoeSpec,
                                         attention_kv_values, layer_groups, layer_params)
from harness.models.model_spec import (ARCHITECTURES, DTYPE_BYTES, KV_DTYPE_BYTES,
                                       ROPE_SCALING_TYPES, TORCH_ARCHITECTURES, ModelSpec,
                                       RopeScaling)
from harness.spec_schema import (Flag, Fraction, Number, PositiveInt, PositiveNumber, Says,
                                 SpecProblem, keep_int, build_spec, check_value, one_of, spec,
                                 to_plain)

GIB = 1024**3
# The most KV slots a run may have: slot numbers (and block ids) are int32 in the block
# tables, slot mappings and kernels, and the block pool keeps per-block state in host
# memory. 2**31 slots is ~2 Gi tokens of KV: 1 TiB even for model=tiny (512 bytes a token),
# far beyond any accelerator for a real model.
MAX_KV_SLOTS = 2**31
# What the top-level ``run`` key may select (harness/__main__.py dispatches on it).
RUN_MODES = ("serve", "study", "kernels")
# How engine.replicas share the requests (harness.engine.replicas).
ROUTERS = ("round_robin", "least_outstanding")
# The top-level keys every run builds from (``harness.run.run_setup``): deleting one (~seed)
# is refused (``harness.config.override_check``).
REQUIRED_KEYS = ("allocator", "block_size", "engine", "hardware", "model", "seed", "systems",
                 "workload")

# What this module offers: its own specs and checks, and (re-exported, so that imports
# from harness.config.specs keep working) the specs of the modules above.
__all__ = ["ARCHITECTURES", "DTYPE_BYTES", "GIB", "KV_DTYPE_BYTES", "MAX_KV_SLOTS",
           "REQUIRED_KEYS", "ROPE_SCALING_TYPES", "RUN_MODES", "SYSTEM_NAME",
           "TORCH_ARCHITECTURES", "ConfigError", "CostSpec", "EngineSpec", "FittedCostSpec",
           "HardwareSpec", "LayerGroup", "LinearAttentionSpec", "MlaSpec", "ModelSpec", "MoeSpec",
           "OffloadSpec", "RopeScaling", "RunOptions", "SloSpec", "SystemSpec", "_uses_block_size", "_with_options",
           "attention_kv_values", "build_spec", "check_run_options", "kv_capacity_slots",
           "layer_groups", "layer_params", "run_options", "select_systems", "to_plain", "validate_block_size",
           "wants_report"]

# engine.kv_capacity_slots: at most MAX_KV_SLOTS
KvSlots = Annotated[PositiveInt, Field(le=MAX_KV_SLOTS),
                    Says("a positive integer", hint=" (slot numbers are int32 in the block tables "
                                                    "and kernels)")]
Device = Annotated[str, Strict(), Field(pattern=r"^(auto|cpu|cuda|cuda:.*)$"),
                   Says("auto, cpu, cuda or cuda:N")]


def _tensor_parallel(value: Any) -> Any:
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise SpecProblem("", f"must be a positive integer or auto, got {value!r}")
    return value


@spec
class EngineSpec:
    """Scheduler and executor settings."""

    executor: one_of(("sim", "torch"), Says("'sim' or 'torch'", got=False)) = "sim"
    scheduling: one_of(("continuous", "static"), Says("'continuous' or 'static'", got=False)) = "continuous"
    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt = 8192
    chunked_prefill: Flag = True  # as vLLM V1; the paper's studies set false (vLLM v0.1)
    preemption: one_of(("recompute", "swap"), Says("'recompute' or 'swap'", got=False)) = "recompute"
    gpu_memory_utilization: Fraction = 0.9
    activation_reserve_gib: Number = 2.0
    kv_capacity_slots: KvSlots | None = None
    swap_space_gib: Number = 4.0
    max_model_len: PositiveInt | None = None
    wall_time_limit_s: PositiveNumber | None = None
    fast_forward: Flag = True
    # GPUs a model is sharded over (harness.config.parallelism): auto = the smallest power
    # of two that holds the weights and one max_model_len sequence; replicas behind a router
    tensor_parallel: Annotated[int | str, BeforeValidator(_tensor_parallel)] = "auto"
    replicas: PositiveInt = 1
    router: one_of(ROUTERS) = "round_robin"  # round_robin | least_outstanding
    # record each KV block's lifetime, idle time before eviction and reuse gap (paged
    # systems; harness.metrics.residency): results.json's kv_residency
    kv_residency: Flag = True
    cost: CostSpec = field(default_factory=CostSpec)
    # CPU / disk tiers behind the GPU prefix cache (harness.config.offload; 0 GiB = off)
    offload: OffloadSpec = field(default_factory=OffloadSpec)
    # --- torch executor (engine=torch); the sim executor ignores these ---
    device: Device = "auto"  # auto (cuda if available, else cpu) | cpu | cuda | cuda:N
    # Accumulate every op in float64 and round to the model dtype, so a token's result
    # does not depend on batch composition or kernel path (paged == contiguous token for
    # token). null = on for CPU, off for CUDA.
    batch_invariant: Annotated[Flag, Says("true or false", or_null="true, false or null",
                                          hint=" (null = on for CPU, off for CUDA)")] | None = None
    # auto (Triton on CUDA, torch reference on CPU) | triton | torch
    kernel_backend: one_of(("auto", "triton", "torch"), Says("auto, triton or torch")) = "auto"
    block_tables_on_device: Flag = False  # keep block tables resident; upload changed rows only
    # greedy (every sample argmax) | seeded (sample 0 greedy, others seeded)
    sampling: one_of(("greedy", "seeded"), Says("greedy or seeded")) = "seeded"
    # NVML sampling period in seconds (0 = no telemetry)
    telemetry_interval_s: Annotated[Number, Says("a number >= 0", hint=" (0 = no NVML telemetry)")] = 0.1
    profile_activation_tokens: PositiveInt | None = None  # capacity profiling pass; null = max_num_batched_tokens
    cpu_threads: PositiveInt | None = None  # torch intra-op threads for CPU runs (null = torch's default)
    cuda_graphs: Flag = True  # CUDA: decode steps replay graphs captured per batch bucket; false = eager


def _registered_manager(kind: Any) -> Any:
    from pagebench.allocators.registry import MANAGERS  # NOTE: here, so that importing the config stays light
    if not isinstance(kind, str) or kind not in MANAGERS:
        raise SpecProblem("", f"must be one of {', '.join(sorted(MANAGERS))} (a registered "
                          f"manager), got {kind!r}")
    return kind


@spec
class SystemSpec:
    """One system = a KV manager configuration (with the scheduler of the run)."""

    name: str
    kind: Annotated[str, BeforeValidator(_registered_manager)]
    prefix_caching: Flag = False
    policy: str | None = None
    arena: str = "buddy"
    block_size: PositiveInt | None = None
    # the keys a manager declares for itself (its class's ``options``), as (key, value) pairs
    options: tuple[tuple[str, Any], ...] = ()

    def option(self, key: str) -> Any:
        """The value of the manager-specific catalog key ``key``."""
        return dict(self.options)[key]

    @model_validator(mode="after")
    def _its_manager_takes_it(self) -> "SystemSpec":
        from pagebench.allocators.registry import MANAGERS
        problem = MANAGERS[self.kind].system_problem(self, None)
        if problem is not None:
            raise SpecProblem(*problem)
        return self

    @property
    def label(self) -> str:
        from pagebench.allocators.registry import MANAGERS
        return MANAGERS[self.kind].label(self)


# an SLO target in milliseconds
SloTarget = Annotated[PositiveNumber, Says("a positive number", hint=" (milliseconds; null = no target)")]
Percentile = Annotated[float, Strict(), Field(gt=0, le=100), WrapValidator(keep_int)]


@spec
class SloSpec:
    """The service-level objective a run's goodput counts against (``slo`` in the config;
    ``harness.metrics.latency``), and the latency percentiles results.json reports.

    A request is good when it finished and meets every target set: TTFT, TPOT (its mean
    time per output token after the first; not applied to a one-token output, as in
    vLLM's ``--goodput``) and E2E latency, each in milliseconds; null = no target.
    """

    ttft_ms: SloTarget | None = None
    tpot_ms: SloTarget | None = None
    e2el_ms: SloTarget | None = None
    percentiles: Annotated[tuple[Percentile, ...], Field(min_length=1),
                           Says("a non-empty list of numbers in (0, 100], e.g. [50, 90, 99]")] = (50, 90, 99)

    @property
    def targets_ms(self) -> dict[str, float]:
        """The targets set, by metric name (ttft, tpot, e2el), in milliseconds."""
        return {name: value for name, value in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms),
                                                ("e2el", self.e2el_ms)) if value is not None}


def _known_mode(mode: Any) -> Any:
    if not isinstance(mode, str) or mode not in RUN_MODES:
        raise SpecProblem("", (
            f"unknown run mode {mode!r}.{did_you_mean(str(mode), RUN_MODES)} Valid modes: "
            f"{', '.join(RUN_MODES)} (serve runs the systems through the engine; study and "
            "kernels come with their experiments, e.g. experiment=vllm_fig12, experiment=kernels)"))
    return mode


@spec
class RunOptions:
    """The top-level keys a run reads besides the specs: ``run`` names a mode
    (``harness/__main__.py`` sends every mode but study and kernels to the serving run, so
    a misspelt one would otherwise run a plain serve), ``progress`` and ``report`` (whether
    the run writes report.html) are booleans."""

    run: Annotated[Any, AfterValidator(_known_mode)] = "serve"
    progress: Annotated[Flag, Says("true or false", after=" (progress=false hides the progress "
                                                          "bars)")] = True
    report: Annotated[Flag, Says("true or false", after=" (report=false skips report.html; python "
                                                        "-m pagebench.reports DIR renders it later)")] = True


def run_options(cfg: Mapping[str, Any]) -> RunOptions:
    """The checked ``RunOptions`` of a config (its other keys aside)."""
    return build_spec(RunOptions, {key: cfg[key] for key in ("run", "progress", "report")
                                   if key in cfg}, "")


def check_run_options(cfg: Mapping[str, Any]) -> None:
    """``ConfigError`` unless ``run``, ``progress`` and ``report`` are valid (``RunOptions``)."""
    run_options(cfg)


def wants_report(cfg: Mapping[str, Any]) -> bool:
    """The top-level ``report`` key: whether the run writes report.html (default true)."""
    return run_options(cfg).report


BlockSize = Annotated[PositiveInt, Says("a positive integer", hint=" (tokens per KV block, e.g. 16)")]


def validate_block_size(value: Any) -> int:
    """The top-level block_size: a positive integer."""
    return check_value(BlockSize, value, "block_size")


SYSTEM_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # steps_<name>.csv: never a path


def _with_options(node: dict, where: str) -> dict:
    """``node`` with the keys its manager declares (``options``) moved into ``options``;
    each must be given."""
    from pagebench.allocators.registry import MANAGERS
    kind = node.get("kind")
    declared = MANAGERS[kind].options if isinstance(kind, str) and kind in MANAGERS else ()
    missing = [key for key in declared if key not in node]
    if missing:
        raise ConfigError(f"{where}.{missing[0]}: missing value; a {kind} system needs "
                          f"{', '.join(declared)}")
    node["options"] = tuple((key, node.pop(key)) for key in declared)
    return node


def _uses_block_size(kind: Any) -> bool:
    """Whether the manager ``kind`` takes the top-level block_size (paged, radix...)."""
    from pagebench.allocators.registry import MANAGERS
    return isinstance(kind, str) and kind in MANAGERS and MANAGERS[kind].uses_block_size


def select_systems(names: Any, catalog: Mapping[str, Any], block_size: int) -> list[SystemSpec]:
    """The systems named in ``systems=[...]``, from the ``allocator`` catalog."""
    names = to_plain(names)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    catalog = to_plain(catalog) or {}
    if not isinstance(catalog, dict):
        raise ConfigError(f"allocator: must be the catalog of systems (name: its keys), got "
                          f"{catalog!r}")
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"systems: must be a list of system names from the allocator catalog, "
                          f"e.g. systems=[paged,max]; got {names!r}")
    if not names:
        raise ConfigError(f"systems: name at least one system; known: {', '.join(catalog)}")
    for key, name in [*((f"allocator.{n}", n) for n in catalog), *(("systems", n) for n in names)]:
        if not SYSTEM_NAME.fullmatch(str(name)) or name in (".", ".."):  # names files
            raise ConfigError(f"{key}: system name {name!r} must be a plain name (letters, "
                              "digits, '_', '-', '.'): it names the run's files")
    specs = []
    for name in names:
        if name not in catalog:
            raise ConfigError(
                f"systems: unknown system {name!r}; known systems: {', '.join(catalog)} "
                "(add one under allocator.<name>)"
            )
        if not isinstance(catalog[name], dict):
            raise ConfigError(f"allocator.{name}: must be a mapping of the system's keys (kind, "
                              f"...), got {catalog[name]!r}")
        node = _with_options(dict(catalog[name]), f"allocator.{name}")
        if node.get("block_size") is None and _uses_block_size(node.get("kind")):
            node["block_size"] = block_size
        specs.append(build_spec(SystemSpec, node, f"allocator.{name}", name=name))
    if len(set(names)) != len(names):
        raise ConfigError(f"systems: {names} names a system twice")
    return specs


def kv_capacity_slots(model: ModelSpec, hardware: HardwareSpec, engine: EngineSpec) -> int:
    """KV slots that fit: explicit override, or what is left after weights and activations.

    An explicit ``engine.kv_capacity_slots`` may ignore the weights (the PagedAttention
    paper's setup gives the KV cache 12 GiB outright), but its KV must fit in the
    hardware's whole memory: more is a pool the modelled device could not hold.
    """
    if engine.kv_capacity_slots is not None:
        slots = engine.kv_capacity_slots
        kv_bytes = slots * model.bytes_per_slot
        if kv_bytes > hardware.memory_gib * GIB:
            raise ConfigError(
                f"engine.kv_capacity_slots={slots:,} is more KV than hardware={hardware.name} holds: "
                f"{slots:,} slots x {model.bytes_per_slot:,} bytes ({model.name}) = "
                f"{kv_bytes / GIB:,.1f} GiB > hardware.memory_gib={hardware.memory_gib}; at most "
                f"{int(hardware.memory_gib * GIB // model.bytes_per_slot):,} slots fit (or null to "
                "derive it from the memory left after the weights)")
        return slots
    budget = hardware.memory_gib * GIB * engine.gpu_memory_utilization
    free = budget - model.weight_bytes - engine.activation_reserve_gib * GIB
    if free / model.bytes_per_slot > MAX_KV_SLOTS:
        raise ConfigError(
            f"hardware.memory_gib={hardware.memory_gib} leaves room for "
            f"{free / model.bytes_per_slot:.3g} KV slots of {model.name}, more than the "
            f"{MAX_KV_SLOTS:,} a run supports (slot numbers are int32 in the block tables and "
            "kernels): give the device's real memory, or set engine.kv_capacity_slots")
    slots = int(free // model.bytes_per_slot)
    if slots <= 0:
        raise ConfigError(
            f"model={model.name} does not fit hardware={hardware.name}: weights take "
            f"{model.weight_bytes / GIB:.1f} GiB of {hardware.memory_gib * engine.gpu_memory_utilization:.1f} "
            f"GiB usable ({hardware.memory_gib} GiB x engine.gpu_memory_utilization="
            f"{engine.gpu_memory_utilization}; +{engine.activation_reserve_gib} GiB activations, "
            "engine.activation_reserve_gib), leaving no KV cache. Choose a larger hardware "
            "profile, a smaller model, raise engine.gpu_memory_utilization, or set "
            "engine.kv_capacity_slots."
        )
    return slots
