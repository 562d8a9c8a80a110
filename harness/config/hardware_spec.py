"""The hardware and cost-model specs: an accelerator's memory and peak rates
(``HardwareSpec``), the step-time coefficients fitted to measured runs
(``FittedCostSpec``) and the sim executor's cost model settings (``CostSpec``)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.models.model_spec import DTYPE_BYTES, ModelSpec
from harness.config.spec_checks import (_NESTED, FRACTION, POSITIVE, _require, _require_int,
                                 _require_number, _require_str)


@dataclass(frozen=True)
class FittedCostSpec:
    """Step-time coefficients fitted to measured torch runs (``python -m harness.tools.calibrate``).

    Step time = step_overhead_s + max(per_token_s * tokens, linear_floor_s)
    + per_attention_pair_s * pairs
    + per_kv_read_slot_s * cached slots read + per_seq_s * sequences
    + per_prefill_chunk_s * prefill chunks (+ copies and swaps as in the roofline).
    Used for the model it was measured on (name, layers, dtype); other models get the
    roofline with the derived ``compute_efficiency`` / ``bandwidth_efficiency``.
    """

    model: str
    num_layers: int
    dtype: str
    step_overhead_s: float
    per_token_s: float
    per_attention_pair_s: float
    per_kv_read_slot_s: float
    per_seq_s: float
    per_prefill_chunk_s: float = 0.0
    # the linear layers' roofline floor: max(per_token_s * tokens, linear_floor_s) (the
    # weights' read time; 0 = a plain linear term, as in profiles fitted before it)
    linear_floor_s: float = 0.0
    compute_efficiency: float | None = None
    bandwidth_efficiency: float | None = None
    # The range measured: the largest batch, and the most KV a sequence held (context plus
    # output). Steps beyond it are extrapolated (``harness.engine.fit_range``); None in
    # profiles written before calibrate recorded it.
    max_batch_size: int | None = None
    max_context_len: int | None = None

    def validate(self, where: str) -> None:
        _require_str(self, where, "model")
        _require_int(self, where, "num_layers")
        _require_number(self, where, "step_overhead_s", "per_token_s", "per_attention_pair_s",
                        "per_kv_read_slot_s", "per_seq_s", "per_prefill_chunk_s", "linear_floor_s")
        _require_int(self, where, "max_batch_size", "max_context_len", optional=True)
        _require_number(self, where, "compute_efficiency", "bandwidth_efficiency", rule=FRACTION,
                        optional=True)
        _require(isinstance(self.dtype, str) and self.dtype in DTYPE_BYTES, f"{where}.dtype",
                 f"must be one of {', '.join(DTYPE_BYTES)}")

    def applies_to(self, model: "ModelSpec") -> bool:
        return (self.model == model.name and self.num_layers == model.layers
                and self.dtype == model.dtype)


@dataclass(frozen=True)
class HardwareSpec:
    """An accelerator's memory and peak rates (and, once calibrated, fitted step costs)."""

    name: str
    memory_gib: float
    hbm_bandwidth_gbps: float
    peak_fp16_tflops: float
    fitted: FittedCostSpec | None = None
    # the contiguous systems' own fit (python -m harness.tools.calibrate fits each layout apart);
    # None: ``fitted`` serves them too
    fitted_contiguous: FittedCostSpec | None = None
    # The decode-attention kernel profile (conf/kernel_profile/<name>.yaml) the operator
    # cost model uses when engine.cost.kernel_profile is null.
    kernel_profile: str = "ideal"
    # Measured on this hardware (the YAML cites the measurement); each replaces engine.cost's
    # generic default (its value left at CostSpec's default) in the operator cost model:
    # the host profile (conf/host_profile/<name>.yaml or a path) and the linear layers'
    # efficiencies (None: engine.cost's).
    host_profile: str | None = None
    compute_efficiency: float | None = None
    bandwidth_efficiency: float | None = None
    # NVLink (tensor parallelism, ``harness.config.parallelism``): a GPU's bandwidth in one
    # direction (GB/s; half the spec sheet's bidirectional figure) and how many GPUs one
    # NVLink domain joins (an HGX board's 8); null = no NVLink (engine.tensor_parallel=1).
    nvlink_gbps: float | None = None
    nvlink_gpus: int = 1

    def validate(self, where: str) -> None:
        _require_str(self, where, "name", "kernel_profile")
        _require(self.host_profile is None or (isinstance(self.host_profile, str) and self.host_profile != ""),
                 f"{where}.host_profile", f"must be a name, a path or null, got {self.host_profile!r}")
        _require_number(self, where, "memory_gib", "hbm_bandwidth_gbps", "peak_fp16_tflops",
                        rule=POSITIVE)
        _require_number(self, where, "compute_efficiency", "bandwidth_efficiency", rule=FRACTION,
                        optional=True)
        _require_number(self, where, "nvlink_gbps", rule=POSITIVE, optional=True)
        _require_int(self, where, "nvlink_gpus")


@dataclass(frozen=True)
class CostSpec:
    """The sim executor's cost model: ``roofline`` (one max over the step) or ``operator``
    (per-operator terms, ``harness.engine.cost_operator``), and their parameters."""

    compute_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    step_overhead_s: float = 0.002  # roofline only (the operator model has the host profile)
    model: str = "operator"
    # operator only: conf/kernel_profile/<name>.yaml (null = the hardware's kernel_profile)
    # and conf/host_profile/<name>.yaml, or paths to such files
    kernel_profile: str | None = None
    host_profile: str = "vidur_a100_llama2_7b_tp1"
    # the kernel_results.json a ``source: kernel_results`` profile reads (null = its own path)
    kernel_results: str | None = None

    def validate(self, where: str) -> None:
        _require(self.model in ("roofline", "operator"), f"{where}.model",
                 f"must be roofline or operator, got {self.model!r}")
        _require_number(self, where, "compute_efficiency", "bandwidth_efficiency", rule=FRACTION)
        _require_number(self, where, "step_overhead_s")
        for key in ("kernel_profile", "kernel_results"):
            value = getattr(self, key)
            _require(value is None or (isinstance(value, str) and value != ""), f"{where}.{key}",
                     f"must be a name, a path or null, got {value!r}")
        _require_str(self, where, "host_profile")


_NESTED.update({("HardwareSpec", "fitted"): FittedCostSpec,
                ("HardwareSpec", "fitted_contiguous"): FittedCostSpec})
