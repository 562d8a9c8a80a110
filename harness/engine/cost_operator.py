"""The per-operator step cost model (``engine.cost.model=operator``).

A step's time is the sum of its operators' times, each priced on its own (they run one
after the other on the device's stream, then the host's work; nothing overlaps):

* ``linear``: the projections and MLP of every layer and the LM head, one GEMM per matrix
  over the step's batched tokens, so the weights are read once per step:
  ``max(tokens * 2 * (params - vocab * hidden) / (peak * compute_efficiency),
  weight_bytes / (bandwidth * bandwidth_efficiency))``. Without chunked prefill a step is
  all prefill or all decode, so this is each phase's own roofline.
* ``attention_prefill``: ``4 * layers * heads * head_dim`` FLOPs per (query, context)
  pair of the prefill chunks, causal (token i of a chunk from position s attends to
  s + i + 1 positions), at ``peak * compute_efficiency``.
* ``attention_decode``: the KV the decodes read (``bytes_per_slot`` per slot, each
  decode reading its context and its own token) at ``bandwidth * e``, where ``e`` is the
  kernel profile's efficiency for the layout (paged / contiguous), block size, GQA group,
  head dim and dtype of the run, at the step's decode batch and mean context
  (``harness.engine.cost_profiles``).
* ``kv_write``: each computed token's KV written, ``bytes_per_slot`` at
  ``bandwidth * bandwidth_efficiency``; ``copy``: copy-on-write / fork block copies, read
  and written (2 x); ``swap``: swapped slots over the host link (``swap_bandwidth_gbps``).
* ``host``: the host profile's ``per_step_s + per_seq_s * scheduled sequences``
  (scheduling, input preparation, sampling, output processing).

Under tensor parallelism (``engine.tensor_parallel`` = N) ``model`` is one GPU's shard
(``harness.config.parallelism``) and ``linear`` adds the row-parallel layers' all-reduces:
two a layer of the step's tokens' hidden states (``AllReduceCost.seconds(tokens)``).

``bandwidth`` and ``peak`` are the hardware profile's spec-sheet figures; the efficiencies
are ``engine.cost``'s (or a calibrated profile's derived ones, as in the roofline).

This is the pricing of a model whose layers are all full attention; sliding-window, MLA
and linear layers are priced by ``harness.engine.cost_layered.LayeredOperatorCostModel``.
"""

from __future__ import annotations

import numpy as np

from harness.config.parallelism import AllReduceCost
from harness.config.specs import CostSpec, HardwareSpec, ModelSpec
from harness.engine.cost_profiles import (DecodeEfficiency, decode_efficiency, load_host_profile,
                                          load_kernel_profile)

# The phases of a step, in the order they are summed (the steps_*.csv columns, ``_s`` added).
PHASES = ("linear", "attention_prefill", "attention_decode", "kv_write", "copy", "swap", "host")
# The host link's bandwidth (GB/s) swaps and offload-tier loads cross (the project's swap
# figure: about PCIe 4.0 x16's 32 GB/s per direction less protocol overhead).
HOST_LINK_GBPS = 25.0
# Longer spans of a kernel profile flat in batch and context are priced on numpy arrays
# (IEEE doubles, the same operations in the same order as ``phases``: the same bits).
SCALAR_SPAN = 64


def kernel_profile_name(hardware: HardwareSpec, cost: CostSpec) -> str:
    """The kernel profile a run uses: ``engine.cost.kernel_profile``, else the hardware's."""
    return cost.kernel_profile or hardware.kernel_profile


def host_profile_name(hardware: HardwareSpec, cost: CostSpec) -> str:
    """The host profile a run uses: ``engine.cost.host_profile`` when it names another than
    the default, else the hardware's measured one (if it has one), else the default."""
    if cost.host_profile != CostSpec.host_profile or hardware.host_profile is None:
        return cost.host_profile
    return hardware.host_profile


def hardware_efficiencies(hardware: HardwareSpec, cost: CostSpec) -> tuple[float, float]:
    """The linear layers' (compute, bandwidth) efficiencies: each ``engine.cost``'s when set
    to another value than its default, else the hardware's measured one, else the default."""
    compute, bandwidth = cost.compute_efficiency, cost.bandwidth_efficiency
    if compute == CostSpec.compute_efficiency and hardware.compute_efficiency is not None:
        compute = hardware.compute_efficiency
    if bandwidth == CostSpec.bandwidth_efficiency and hardware.bandwidth_efficiency is not None:
        bandwidth = hardware.bandwidth_efficiency
    return compute, bandwidth


class OperatorCostModel:
    """Prices a step as the sum of ``PHASES`` (see the module docstring) for one system:
    its layout (``paged`` or ``contiguous``) and block size select the decode kernel's
    efficiency curve."""

    fit = None  # (a calibrated fit of the run's model prices with the roofline's fit instead)
    layers = None  # every layer full attention (cost_layered's models set their groups)

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, cost: CostSpec, layout: str,
                 block_size: int | None, swap_bandwidth_gbps: float = HOST_LINK_GBPS,
                 allreduce: AllReduceCost | None = None) -> None:
        # NOTE: None (one GPU) adds no term, so the steps price bit for bit as before
        self.allreduce = allreduce
        compute_eff, bandwidth_eff = hardware_efficiencies(hardware, cost)
        fitted = hardware.fitted_contiguous if layout == "contiguous" else None
        fitted = fitted or hardware.fitted
        if fitted is not None:
            compute_eff = fitted.compute_efficiency or compute_eff
            bandwidth_eff = fitted.bandwidth_efficiency or bandwidth_eff
        self.peak_flops = peak_flops = hardware.peak_fp16_tflops * 1e12 * compute_eff
        self.bandwidth = bandwidth = hardware.hbm_bandwidth_gbps * 1e9 * bandwidth_eff
        bytes_per_slot = float(model.bytes_per_slot)
        self.token_s = 2.0 * (model.active_params - model.vocab_size * model.hidden_size) / peak_flops
        self.weights_s = float(model.weight_bytes) / bandwidth
        self.prefill_pair_s = 4.0 * model.layers * model.num_heads * model.head_dim / peak_flops
        self.write_slot_s = bytes_per_slot / bandwidth
        self.copy_slot_s = 2.0 * bytes_per_slot / bandwidth
        self.swap_slot_s = bytes_per_slot / (swap_bandwidth_gbps * 1e9)
        # a decode's KV slot at the spec bandwidth, before the kernel's efficiency
        self.read_slot_s = bytes_per_slot / (hardware.hbm_bandwidth_gbps * 1e9)
        profile = load_kernel_profile(kernel_profile_name(hardware, cost), cost.kernel_results)
        self.kernel_profile = profile.name
        self.efficiency: DecodeEfficiency = decode_efficiency(
            profile, layout, block_size, model.num_heads // model.num_kv_heads, model.head_dim,
            model.dtype)
        constant = self.efficiency.constant
        self.read_slot_at_constant_s = self.read_slot_s / constant if constant else None
        host = load_host_profile(host_profile_name(hardware, cost))
        self.host_profile = host.name
        self.host_step_s, self.host_seq_s = host.per_step_s, host.per_seq_s

    def phases(self, tokens: int, prefill_pairs: int, decode_pairs: int, decode_seqs: int,
               copied_slots: int, swapped_slots: int, num_seqs: int) -> tuple[float, ...]:
        """Seconds of each of ``PHASES`` for one step.

        NOTE: ``decode_span`` prices fast-forwarded steps with the same operations on
        the same integers, so bulk and single steps agree bit for bit.
        """
        linear = tokens * self.token_s
        if linear < self.weights_s:
            linear = self.weights_s
        if self.allreduce is not None:
            linear += self.allreduce.seconds(tokens)
        if decode_seqs:
            per_slot = self.read_slot_at_constant_s
            if per_slot is None:
                per_slot = self.read_slot_s / self.efficiency(decode_seqs, decode_pairs / decode_seqs)
            decode = decode_pairs * per_slot
        else:
            decode = 0.0
        return (linear, prefill_pairs * self.prefill_pair_s, decode, tokens * self.write_slot_s,
                copied_slots * self.copy_slot_s, swapped_slots * self.swap_slot_s,
                self.host_step_s + self.host_seq_s * num_seqs)

    def decode_span(self, sum_positions: int, num_seqs: int, span: int
                    ) -> tuple[list[float], tuple[float | list[float], ...]]:
        """``phases`` of ``span`` pure-decode steps: ``num_seqs`` sequences whose positions
        sum to ``sum_positions`` before the first, each appending one token per step (step
        i reads ``sum_positions + num_seqs * i`` cached slots and its own), as (each step's
        seconds, each phase's values along the span: a float, every step's, for all but
        ``attention_decode``, which is a list of ``span`` values): the same numbers, from
        numpy when the profile is flat and the span long."""
        # NOTE: only the decode term varies along the span; every other phase is
        # ``phases``' value for these integers, one float for the span. Prefill, copy and
        # swap are 0.0 (0 times a finite constant), and adding 0.0 to a positive float
        # leaves it as it is: ``step_seconds``' sum in its order is then
        # ((linear + decode) + write) + host.
        linear = num_seqs * self.token_s
        if linear < self.weights_s:
            linear = self.weights_s
        if self.allreduce is not None:  # as in ``phases``
            linear += self.allreduce.seconds(num_seqs)
        write = num_seqs * self.write_slot_s
        host = self.host_step_s + self.host_seq_s * num_seqs
        first = sum_positions + num_seqs  # step i's (query, context) pairs: first + num_seqs * i
        per_slot = self.read_slot_at_constant_s
        if per_slot is None:  # the kernel's efficiency at each step's batch and context
            read_slot_s, efficiency = self.read_slot_s, self.efficiency
            decode = [pairs * (read_slot_s / efficiency(num_seqs, pairs / num_seqs))
                      for pairs in range(first, first + num_seqs * span, num_seqs)]
            seconds = [linear + d + write + host for d in decode]
        elif span <= SCALAR_SPAN:  # Python floats: numpy's per-call cost outweighs the work
            decode = [pairs * per_slot
                      for pairs in range(first, first + num_seqs * span, num_seqs)]
            seconds = [linear + d + write + host for d in decode]
        else:  # [span] float64 (the pairs are below 2**53: exact as floats)
            decode_array = (first + num_seqs * np.arange(span, dtype=np.int64)).astype(np.float64)
            decode_array *= per_slot
            seconds = (linear + decode_array + write + host).tolist()
            decode = decode_array.tolist()
        return seconds, (linear, 0.0, decode, write, 0.0, 0.0, host)

    def range_report(self) -> dict | None:
        """The decode steps priced beyond the kernel profile's measured range, or None when
        the profile holds for any batch and context."""
        eff = self.efficiency
        if not eff.ranged and eff.note is None:
            return None
        return {"kernel_profile": self.kernel_profile, **eff.report()}


def step_seconds(phases: tuple[float, ...]) -> float:
    """A step's time: its phases summed in ``PHASES`` order."""
    linear, prefill, decode, write, copy, swap, host = phases
    return linear + prefill + decode + write + copy + swap + host
