"""Typed, validated views of the Hydra config.

Hydra composes YAML; these frozen dataclasses are what the code uses. Each
``from_node`` rejects unknown keys and invalid values with a ``ConfigError``
that names the key (``engine.max_num_seqs``) and says how to fix it.

The specs live in their own modules (``harness.models.model_spec``, ``harness.config.hardware_spec``;
the typed checks in ``harness.config.spec_checks``); this module keeps the engine and system
specs, the run options and the capacity, and re-exports the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from harness.errors import ConfigError, did_you_mean
from harness.config.hardware_spec import CostSpec, FittedCostSpec, HardwareSpec
from harness.config.offload import OffloadSpec
from harness.models.model_layers import (LayerGroup, LinearAttentionSpec, MlaSpec, MoeSpec,
                                  attention_kv_values, layer_groups, layer_params, validate_layers)
from harness.models.model_spec import (ARCHITECTURES, DTYPE_BYTES, KV_DTYPE_BYTES, ROPE_SCALING_TYPES,
                                TORCH_ARCHITECTURES, ModelSpec, RopeScaling)
from harness.config.spec_checks import (_NESTED, FRACTION, NON_NEGATIVE, POSITIVE, _field_default,
                                 _is_int, _require, _require_bool, _require_int, _require_number,
                                 _require_str, build_spec, to_plain)

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

# What this module offers: its own specs and checks, and (re-exported, so that imports
# from harness.config.specs keep working) the specs and checks of the modules above.
__all__ = ["ARCHITECTURES", "DTYPE_BYTES", "FRACTION", "GIB", "KV_DTYPE_BYTES", "MAX_KV_SLOTS",
           "NON_NEGATIVE", "POSITIVE", "ROPE_SCALING_TYPES", "RUN_MODES", "SYSTEM_NAME",
           "TORCH_ARCHITECTURES", "ConfigError", "CostSpec", "EngineSpec", "FittedCostSpec",
           "HardwareSpec", "LayerGroup", "LinearAttentionSpec", "MlaSpec", "ModelSpec", "MoeSpec",
           "RopeScaling", "SloSpec", "SystemSpec", "_NESTED", "_field_default", "_is_int", "_require",
           "_require_bool", "_require_int", "_require_number", "_require_str", "_uses_block_size",
           "_with_options", "attention_kv_values", "build_spec", "check_run_options",
           "did_you_mean", "kv_capacity_slots", "layer_groups", "layer_params", "select_systems",
           "to_plain", "validate_block_size", "validate_layers", "wants_report"]


@dataclass(frozen=True)
class EngineSpec:
    """Scheduler and executor settings."""

    executor: str = "sim"
    scheduling: str = "continuous"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True  # as vLLM V1; the paper's studies set false (vLLM v0.1)
    preemption: str = "recompute"
    gpu_memory_utilization: float = 0.9
    activation_reserve_gib: float = 2.0
    kv_capacity_slots: int | None = None
    swap_space_gib: float = 4.0
    max_model_len: int | None = None
    wall_time_limit_s: float | None = None
    fast_forward: bool = True
    # GPUs a model is sharded over (harness.config.parallelism): auto = the smallest power
    # of two that holds the weights and one max_model_len sequence; replicas behind a router
    tensor_parallel: int | str = "auto"
    replicas: int = 1
    router: str = "round_robin"  # round_robin | least_outstanding
    # record each KV block's lifetime, idle time before eviction and reuse gap (paged
    # systems; harness.metrics.residency): results.json's kv_residency
    kv_residency: bool = True
    cost: CostSpec = field(default_factory=CostSpec)
    # CPU / disk tiers behind the GPU prefix cache (harness.config.offload; 0 GiB = off)
    offload: OffloadSpec = field(default_factory=OffloadSpec)
    # --- torch executor (engine=torch); the sim executor ignores these ---
    device: str = "auto"  # auto (cuda if available, else cpu) | cpu | cuda | cuda:N
    # Accumulate every op in float64 and round to the model dtype, so a token's result
    # does not depend on batch composition or kernel path (paged == contiguous token for
    # token). null = on for CPU, off for CUDA.
    batch_invariant: bool | None = None
    kernel_backend: str = "auto"  # auto (Triton on CUDA, torch reference on CPU) | triton | torch
    block_tables_on_device: bool = False  # keep block tables resident; upload changed rows only
    sampling: str = "seeded"  # greedy (every sample argmax) | seeded (sample 0 greedy, others seeded)
    telemetry_interval_s: float = 0.1  # NVML sampling period in seconds (0 = no telemetry)
    profile_activation_tokens: int | None = None  # capacity profiling pass; null = max_num_batched_tokens
    cpu_threads: int | None = None  # torch intra-op threads for CPU runs (null = torch's default)
    cuda_graphs: bool = True  # CUDA: decode steps replay graphs captured per batch bucket; false = eager

    def validate(self, where: str) -> None:
        _require(self.executor in ("sim", "torch"), f"{where}.executor", "must be 'sim' or 'torch'")
        _require(self.scheduling in ("continuous", "static"), f"{where}.scheduling",
                 "must be 'continuous' or 'static'")
        _require(self.preemption in ("recompute", "swap"), f"{where}.preemption",
                 "must be 'recompute' or 'swap'")
        _require_int(self, where, "max_num_seqs", "max_num_batched_tokens")
        _require_bool(self, where, "chunked_prefill", "fast_forward", "block_tables_on_device",
                      "cuda_graphs", "kv_residency")
        _require_number(self, where, "gpu_memory_utilization", rule=FRACTION)
        _require_number(self, where, "activation_reserve_gib", "swap_space_gib")
        _require_int(self, where, "kv_capacity_slots", optional=True, maximum=MAX_KV_SLOTS,
                     hint=" (slot numbers are int32 in the block tables and kernels)")
        _require_int(self, where, "max_model_len", optional=True)
        _require_number(self, where, "wall_time_limit_s", rule=POSITIVE, optional=True)
        _require(isinstance(self.device, str) and (self.device in ("auto", "cpu", "cuda")
                                                   or self.device.startswith("cuda:")),
                 f"{where}.device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        _require_bool(self, where, "batch_invariant", optional=True,
                      hint=" (null = on for CPU, off for CUDA)")
        _require(self.kernel_backend in ("auto", "triton", "torch"), f"{where}.kernel_backend",
                 f"must be auto, triton or torch, got {self.kernel_backend!r}")
        _require(self.sampling in ("greedy", "seeded"), f"{where}.sampling",
                 f"must be greedy or seeded, got {self.sampling!r}")
        _require_number(self, where, "telemetry_interval_s", hint=" (0 = no NVML telemetry)")
        _require_int(self, where, "cpu_threads", "profile_activation_tokens", optional=True)
        _require(self.tensor_parallel == "auto" or _is_int(self.tensor_parallel)
                 and self.tensor_parallel > 0, f"{where}.tensor_parallel",
                 f"must be a positive integer or auto, got {self.tensor_parallel!r}")
        _require_int(self, where, "replicas")
        _require(self.router in ROUTERS, f"{where}.router",
                 f"must be one of {', '.join(ROUTERS)}, got {self.router!r}")


@dataclass(frozen=True)
class SystemSpec:
    """One system = a KV manager configuration (with the scheduler of the run)."""

    name: str
    kind: str
    prefix_caching: bool = False
    policy: str | None = None
    arena: str = "buddy"
    block_size: int | None = None
    # the keys a manager declares for itself (its class's ``options``), as (key, value) pairs
    options: tuple[tuple[str, Any], ...] = ()

    def option(self, key: str) -> Any:
        """The value of the manager-specific catalog key ``key``."""
        return dict(self.options)[key]

    def validate(self, where: str) -> None:
        from pagebench.allocators.registry import MANAGERS  # NOTE: here, so that importing the config stays light
        _require(self.kind in MANAGERS, f"{where}.kind",
                 f"must be one of {', '.join(sorted(MANAGERS))} (a registered manager), "
                 f"got {self.kind!r}")
        _require_int(self, where, "block_size", optional=True)
        _require_bool(self, where, "prefix_caching")
        problem = MANAGERS[self.kind].system_problem(self, None)
        if problem is not None:
            raise ConfigError(f"{where}.{problem[0]}: {problem[1]}")

    @property
    def label(self) -> str:
        from pagebench.allocators.registry import MANAGERS
        return MANAGERS[self.kind].label(self)


@dataclass(frozen=True)
class SloSpec:
    """The service-level objective a run's goodput counts against (``slo`` in the config;
    ``harness.metrics.latency``), and the latency percentiles results.json reports.

    A request is good when it finished and meets every target set: TTFT, TPOT (its mean
    time per output token after the first; not applied to a one-token output, as in
    vLLM's ``--goodput``) and E2E latency, each in milliseconds; null = no target.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    percentiles: tuple[float, ...] = (50, 90, 99)

    @property
    def targets_ms(self) -> dict[str, float]:
        """The targets set, by metric name (ttft, tpot, e2el), in milliseconds."""
        return {name: value for name, value in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms),
                                                ("e2el", self.e2el_ms)) if value is not None}

    def validate(self, where: str) -> None:
        _require_number(self, where, "ttft_ms", "tpot_ms", "e2el_ms", rule=POSITIVE,
                        optional=True, hint=" (milliseconds; null = no target)")
        values = self.percentiles
        _require(isinstance(values, (list, tuple)) and len(values) > 0
                 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                         and 0 < v <= 100 for v in values),
                 f"{where}.percentiles",
                 f"must be a non-empty list of numbers in (0, 100], e.g. [50, 90, 99], got {values!r}")
        object.__setattr__(self, "percentiles", tuple(values))


_NESTED[("EngineSpec", "cost")] = CostSpec
_NESTED[("EngineSpec", "offload")] = OffloadSpec


def check_run_options(cfg: Mapping[str, Any]) -> None:
    """The top-level keys a serving run reads besides the specs: ``run`` must name a mode
    (``harness/__main__.py`` sends every mode but study and kernels to the serving run, so
    a misspelt one would otherwise run a plain serve) and ``progress`` must be a boolean."""
    mode = cfg.get("run", "serve")
    if not isinstance(mode, str) or mode not in RUN_MODES:
        raise ConfigError(
            f"run: unknown run mode {mode!r}.{did_you_mean(str(mode), RUN_MODES)} Valid modes: "
            f"{', '.join(RUN_MODES)} (serve runs the systems through the engine; study and "
            "kernels come with their experiments, e.g. experiment=vllm_fig12, experiment=kernels)")
    progress = cfg.get("progress", True)
    if not isinstance(progress, bool):
        raise ConfigError(f"progress: must be true or false, got {progress!r} (progress=false "
                          "hides the progress bars)")


def wants_report(cfg: Mapping[str, Any]) -> bool:
    """The top-level ``report`` key: whether the run writes report.html (default true)."""
    report = cfg.get("report", True)
    if not isinstance(report, bool):
        raise ConfigError(f"report: must be true or false, got {report!r} (report=false skips "
                          "report.html; python -m pagebench.reports DIR renders it later)")
    return report


def validate_block_size(value: Any) -> int:
    """The top-level block_size: a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"block_size: must be a positive integer (tokens per KV block, e.g. 16), got {value!r}"
        )
    return value


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
