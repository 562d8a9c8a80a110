"""The hardware and cost-model specs: an accelerator's memory and peak rates
(``HardwareSpec``), the step-time coefficients fitted to measured runs
(``FittedCostSpec``) and the sim executor's cost model settings (``CostSpec``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

from harness.models.model_spec import DTYPE_BYTES, ModelSpec
from harness.spec_schema import (Fraction, Name, Number, PositiveInt, PositiveNumber, Says,
                                 one_of, spec)

# a profile's name or the path of its file
ProfileName = Annotated[str, Strict(), Field(min_length=1), Says("a name, a path")]
CostModel = one_of(("roofline", "operator"), Says("roofline or operator"))
FittedDtype = one_of(DTYPE_BYTES, Says(f"one of {', '.join(DTYPE_BYTES)}", got=False))


@spec
class FittedCostSpec:
    """Step-time coefficients fitted to measured torch runs (``python -m harness.tools.calibrate``).

    Step time = step_overhead_s + max(per_token_s * tokens, linear_floor_s)
    + per_attention_pair_s * pairs
    + per_kv_read_slot_s * cached slots read + per_seq_s * sequences
    + per_prefill_chunk_s * prefill chunks (+ copies and swaps as in the roofline).
    Used for the model it was measured on (name, layers, dtype); other models get the
    roofline with the derived ``compute_efficiency`` / ``bandwidth_efficiency``.
    """

    model: Name
    num_layers: PositiveInt
    dtype: FittedDtype
    step_overhead_s: Number
    per_token_s: Number
    per_attention_pair_s: Number
    per_kv_read_slot_s: Number
    per_seq_s: Number
    per_prefill_chunk_s: Number = 0.0
    # the linear layers' roofline floor: max(per_token_s * tokens, linear_floor_s) (the
    # weights' read time; 0 = a plain linear term, as in profiles fitted before it)
    linear_floor_s: Number = 0.0
    compute_efficiency: Fraction | None = None
    bandwidth_efficiency: Fraction | None = None
    # The range measured: the largest batch, and the most KV a sequence held (context plus
    # output). Steps beyond it are extrapolated (``harness.engine.fit_range``); None in
    # profiles written before calibrate recorded it.
    max_batch_size: PositiveInt | None = None
    max_context_len: PositiveInt | None = None

    def applies_to(self, model: "ModelSpec") -> bool:
        return (self.model == model.name and self.num_layers == model.layers
                and self.dtype == model.dtype)


@spec
class HardwareSpec:
    """An accelerator's memory and peak rates (and, once calibrated, fitted step costs)."""

    name: Name
    memory_gib: PositiveNumber
    hbm_bandwidth_gbps: PositiveNumber
    peak_fp16_tflops: PositiveNumber
    fitted: FittedCostSpec | None = None
    # the contiguous systems' own fit (python -m harness.tools.calibrate fits each layout apart);
    # None: ``fitted`` serves them too
    fitted_contiguous: FittedCostSpec | None = None
    # The decode-attention kernel profile (conf/kernel_profile/<name>.yaml) the operator
    # cost model uses when engine.cost.kernel_profile is null.
    kernel_profile: Name = "ideal"
    # Measured on this hardware (the YAML cites the measurement); each replaces engine.cost's
    # generic default (its value left at CostSpec's default) in the operator cost model:
    # the host profile (conf/host_profile/<name>.yaml or a path) and the linear layers'
    # efficiencies (None: engine.cost's).
    host_profile: ProfileName | None = None
    compute_efficiency: Fraction | None = None
    bandwidth_efficiency: Fraction | None = None
    # NVLink (tensor parallelism, ``harness.config.parallelism``): a GPU's bandwidth in one
    # direction (GB/s; half the spec sheet's bidirectional figure) and how many GPUs one
    # NVLink domain joins (an HGX board's 8); null = no NVLink (engine.tensor_parallel=1).
    nvlink_gbps: PositiveNumber | None = None
    nvlink_gpus: PositiveInt = 1


@spec
class CostSpec:
    """The sim executor's cost model: ``roofline`` (one max over the step) or ``operator``
    (per-operator terms, ``harness.engine.cost_operator``), and their parameters."""

    compute_efficiency: Fraction = 0.6
    bandwidth_efficiency: Fraction = 0.8
    step_overhead_s: Number = 0.002  # roofline only (the operator model has the host profile)
    model: CostModel = "operator"
    # operator only: conf/kernel_profile/<name>.yaml (null = the hardware's kernel_profile)
    # and conf/host_profile/<name>.yaml, or paths to such files
    kernel_profile: ProfileName | None = None
    host_profile: Name = "vidur_a100_llama2_7b_tp1"
    # the kernel_results.json a ``source: kernel_results`` profile reads (null = its own path)
    kernel_results: ProfileName | None = None
