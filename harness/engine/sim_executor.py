"""The ``sim`` executor: turns a step plan into time with a cost model (the roofline here, or
``harness.engine.cost_operator``'s per-operator model)."""

from __future__ import annotations

from array import array
from itertools import chain
from typing import NamedTuple

import numpy as np

from harness.config.specs import CostSpec, HardwareSpec, ModelSpec
from harness.engine.cost_layers import plan_work
from harness.engine.cost_operator import HOST_LINK_GBPS, PHASES, OperatorCostModel, step_seconds
from harness.engine.fit_range import FitRange
from harness.engine.plan import StepPlan
from harness.metrics.step_spans import span_layout

# Spans of at most this many steps are priced on Python floats (see decode_seconds).
SCALAR_SPAN = 24
# The operator model's step columns: ``<phase>_s``, in ``PHASES`` order.
PHASE_COLUMNS = tuple(f"{name}_s" for name in PHASES)


class StepCost(NamedTuple):
    """What one step costs, and the two sides of the roofline.

    NOTE: a NamedTuple (immutable, and cheaper to build than a frozen dataclass): the sim
    executor prices every scheduled step with one.
    """

    seconds: float
    flops: float
    bytes: float


class RooflineCostModel:
    """Step time = overhead + max(FLOPs / effective peak, bytes / effective bandwidth) + swaps.

    FLOPs: 2 * parameters per computed token (the linear layers) plus attention,
    4 * layers * heads * head_dim per (query token, context token) pair.
    Bytes: the weights once per step, each scheduled sequence's KV read once,
    the new tokens' KV written, and block copies (read + write).
    Swaps move KV over the host link at ``swap_bandwidth_gbps``.

    Calibrated hardware (``hardware.fitted``, and ``fitted_contiguous`` for contiguous
    systems when present, written by ``python -m harness.tools.calibrate``): for the model it
    was measured on, the step time is the fitted model of ``FittedCostSpec`` (plus copies at the effective bandwidth and swaps as above); for
    other models the roofline uses the fit's derived efficiencies instead of ``cost``'s.
    Sliding-window, MLA and linear layers: ``harness.engine.cost_layered``.
    """

    layers = None  # every layer full attention (cost_layered's models set their groups)

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, cost: CostSpec,
                 swap_bandwidth_gbps: float = HOST_LINK_GBPS, layout: str = "paged") -> None:
        self.flops_per_token = 2.0 * (model.active_params - model.vocab_size * model.hidden_size)
        self.attention_flops_per_pair = 4.0 * model.layers * model.num_heads * model.head_dim
        self.weight_bytes = float(model.weight_bytes)
        self.bytes_per_slot = float(model.bytes_per_slot)
        fitted = layout_fit(hardware, layout)
        compute_eff, bandwidth_eff = cost.compute_efficiency, cost.bandwidth_efficiency
        if fitted is not None:
            compute_eff = fitted.compute_efficiency or compute_eff
            bandwidth_eff = fitted.bandwidth_efficiency or bandwidth_eff
        self.fit = fitted if fitted is not None and fitted.applies_to(model) else None
        self.peak_flops = hardware.peak_fp16_tflops * 1e12 * compute_eff
        self.bandwidth = hardware.hbm_bandwidth_gbps * 1e9 * bandwidth_eff
        self.overhead = cost.step_overhead_s
        self.swap_bandwidth = swap_bandwidth_gbps * 1e9

    def step_cost(self, num_tokens: int, attention_pairs: float, kv_read_slots: int,
                  copied_slots: int = 0, swapped_slots: int = 0, num_seqs: int = 0,
                  num_prefill_chunks: int = 0) -> StepCost:
        flops = self.flops_per_token * num_tokens + self.attention_flops_per_pair * attention_pairs
        moved = (self.weight_bytes + self.bytes_per_slot * (kv_read_slots + num_tokens)
                 + 2.0 * self.bytes_per_slot * copied_slots)
        fit = self.fit
        if fit is not None:
            # NOTE: same operation order as decode_seconds, so bulk and single steps agree
            seconds = (fit.step_overhead_s + max(fit.per_token_s * num_tokens, fit.linear_floor_s)
                       + fit.per_attention_pair_s * attention_pairs
                       + fit.per_kv_read_slot_s * kv_read_slots + fit.per_seq_s * num_seqs
                       + fit.per_prefill_chunk_s * num_prefill_chunks)
            seconds += 2.0 * self.bytes_per_slot * copied_slots / self.bandwidth
        else:
            seconds = self.overhead + max(flops / self.peak_flops, moved / self.bandwidth)
        seconds += self.bytes_per_slot * swapped_slots / self.swap_bandwidth
        return StepCost(seconds, flops, moved)


    def decode_seconds(self, sum_positions: int, num_seqs: int, span: int) -> list[float]:
        """Durations of ``span`` pure-decode steps, the same arithmetic as ``step_cost``:
        ``num_seqs`` sequences whose positions sum to ``sum_positions`` before the first
        step, each appending one token per step.

        NOTE: numpy's fixed cost per operation outweighs the arithmetic for short spans
        (most of them), so those are priced on Python floats: IEEE doubles too, with the
        same operations in the same order, hence the same bits.
        """
        if span <= SCALAR_SPAN:
            step = self._decode_step_seconds
            return [step(float(kv_read), num_seqs, max)
                    for kv_read in range(sum_positions, sum_positions + num_seqs * span, num_seqs)]
        kv_read = (sum_positions + num_seqs * np.arange(span, dtype=np.int64)).astype(np.float64)
        return self._decode_step_seconds(kv_read, num_seqs, np.maximum).tolist()

    def _decode_step_seconds(self, kv_read, num_seqs: int, maximum):
        """``step_cost(...).seconds`` of decode steps reading ``kv_read`` cached slots: a
        float (``maximum``: ``max``) or a float64 array (``np.maximum``)."""
        pairs = kv_read + num_seqs  # = the slots read and written, as a float
        fit = self.fit
        if fit is not None:
            return (fit.step_overhead_s + max(fit.per_token_s * num_seqs, fit.linear_floor_s)
                    + fit.per_attention_pair_s * pairs + fit.per_kv_read_slot_s * kv_read
                    + fit.per_seq_s * num_seqs + fit.per_prefill_chunk_s * 0)
        flops = self.flops_per_token * num_seqs + self.attention_flops_per_pair * pairs
        moved = self.weight_bytes + self.bytes_per_slot * pairs
        return self.overhead + maximum(flops / self.peak_flops, moved / self.bandwidth)


class OffloadLoadCost:
    """Seconds to load offload-tier prefix hits into the GPU pool (``engine.offload``), a
    term of its own after the step's cost model (column ``offload_load_s``): the step that
    admits the request waits for its blocks (nothing overlaps, as in the operator model).

    CPU tier: over the host link. Disk tier: the read is staged through host memory and
    then crosses the host link, in chunks, pipelined, so the slower of the disk's read rate
    and the host link bounds it (a datacenter NVMe reads at about half the link's rate).
    """

    def __init__(self, bytes_per_slot: int, disk_read_gbps: float,
                 host_link_gbps: float = HOST_LINK_GBPS) -> None:
        self.host_link_gbps = host_link_gbps
        self.cpu_slot_s = bytes_per_slot / (host_link_gbps * 1e9)
        self.disk_slot_s = bytes_per_slot / (min(disk_read_gbps, host_link_gbps) * 1e9)

    def seconds(self, cpu_slots: int, disk_slots: int) -> float:
        return cpu_slots * self.cpu_slot_s + disk_slots * self.disk_slot_s


def layout_fit(hardware: HardwareSpec, layout: str):
    """The calibrated fit that prices ``layout``'s systems: ``fitted_contiguous`` for
    contiguous ones when the profile has it, else ``fitted`` (or None)."""
    if layout == "contiguous" and hardware.fitted_contiguous is not None:
        return hardware.fitted_contiguous
    return hardware.fitted


class SimExecutor:
    """Advances a virtual clock; generated tokens are the sequences' synthetic ones.

    With a calibrated cost model whose range is known, ``fit_range`` tallies the steps run
    against it (``harness.engine.fit_range``); otherwise it is None. With the operator
    model, ``phase_rows`` holds each executed step's seconds per phase
    (``cost_operator.PHASES``) and ``phase_spans`` each fast-forwarded span's, for the
    steps_*.csv columns; ``kernel_range`` the decode steps priced
    beyond the kernel profile's measured range (or None).
    """

    name = "sim"

    def __init__(self, cost_model: RooflineCostModel | OperatorCostModel, copy_unit_slots: int,
                 page_map_s: float = 0.0, page_unmap_s: float = 0.0,
                 offload_load: OffloadLoadCost | None = None) -> None:
        self.cost_model = cost_model
        self.offload_load = offload_load  # None: no offload tier (no column, no term)
        self.load_column: list[float] = []  # offload_load_s per step (with offload_load only)
        self.copy_unit_slots = copy_unit_slots  # slots per copied unit (block size, or 1)
        self.page_map_s, self.page_unmap_s = page_map_s, page_unmap_s  # per page (vattention)
        fit = cost_model.fit
        self.fit_range = (FitRange(fit.max_batch_size, fit.max_context_len)
                          if fit is not None and fit.max_batch_size and fit.max_context_len
                          else None)
        self.operator = isinstance(cost_model, OperatorCostModel)
        self.phase_rows: list[tuple[float, ...]] = []  # [executed steps] one float a phase
        # NOTE: a fast-forwarded span's phases as one record: (its first step, its steps,
        # each phase's float but attention_decode's, which is the same at every step of a
        # span: ``decode_span``), and its steps' attention_decode values end to end in
        # span_decodes; laid into the columns with numpy at the end (``phase_columns``)
        self.phase_spans: list[tuple[int, int, float, ...]] = []
        self.span_decodes = array("d")  # [the spans' steps]
        self.decode_read_slots = 0  # KV slots the decodes read (attention_decode's work)
        # NOTE: the last span decode_durations priced, for decoded_span: (sum_positions,
        # num_seqs, steps, its phases as decode_span gives them)
        self._priced: tuple[int, int, int, tuple] = (-1, -1, 0, ())
        efficiency = cost_model.efficiency if self.operator else None
        self._tally = efficiency.tally if efficiency is not None and efficiency.ranged else None
        # a model whose layers are not all full attention (harness.engine.cost_layered):
        # its steps are priced by layer group, chosen here once
        self.layers = cost_model.layers
        if self.layers is not None:
            self.execute = self._execute_layered

    def execute(self, plan: StepPlan) -> tuple[float, dict[int, int] | None]:
        copied = len(plan.copies) * self.copy_unit_slots
        swapped = (len(plan.swap_in) + len(plan.swap_out)) * self.copy_unit_slots
        if self.operator:
            prefill_pairs = prefill_seqs = 0
            for chunk in plan.other_chunks:
                n = chunk.end - chunk.start
                if n > 1:
                    prefill_pairs += n * chunk.start + n * (n + 1) // 2
                    prefill_seqs += 1 + len(chunk.members)
            decode_pairs = plan.attention_pairs - prefill_pairs
            decode_seqs = plan.num_seqs - prefill_seqs
            phases = self.cost_model.phases(plan.num_batched_tokens, prefill_pairs, decode_pairs,
                                            decode_seqs, copied, swapped, plan.num_seqs)
            return self._operator_step(plan, phases, decode_pairs, decode_seqs), None
        cost = self.cost_model.step_cost(plan.num_batched_tokens, plan.attention_pairs,
                                         plan.kv_read_slots, copied, swapped, plan.num_seqs,
                                         plan.num_prefill_chunks)
        return self._roofline_step(plan, cost.seconds), None

    def _execute_layered(self, plan: StepPlan) -> tuple[float, dict[int, int] | None]:
        """``execute`` for a layered cost model: the plan's work by layer group."""
        copied = len(plan.copies) * self.copy_unit_slots
        swapped = (len(plan.swap_in) + len(plan.swap_out)) * self.copy_unit_slots
        work = plan_work(plan, self.layers)
        if self.operator:
            phases = self.cost_model.layered_phases(plan.num_batched_tokens, work, copied,
                                                    swapped, plan.num_seqs)
            return self._operator_step(plan, phases, work[4], work[6]), None
        cost = self.cost_model.layered_step_cost(
            plan.num_batched_tokens, plan.attention_pairs, plan.kv_read_slots, work, copied,
            swapped, plan.num_seqs, plan.num_prefill_chunks)
        return self._roofline_step(plan, cost.seconds), None

    def _operator_step(self, plan: StepPlan, phases: tuple[float, ...], decode_pairs: int,
                       decode_seqs: int) -> float:
        """A step priced by phases: page mapping joins host work, the phases are recorded,
        the decodes' reads tallied, and the offload loads added after the phases."""
        if plan.num_mapped_pages or plan.num_unmapped_pages:  # synchronous page mapping:
            phases = (*phases[:-1], phases[-1] + self._mapping_seconds(plan))  # host work
        self.phase_rows.append(phases)
        self.decode_read_slots += decode_pairs
        if self._tally is not None and decode_seqs:
            self._tally(decode_seqs, decode_pairs / decode_seqs)
        if self.offload_load is not None:
            return step_seconds(phases) + self._load_seconds(plan)
        return step_seconds(phases)

    def _roofline_step(self, plan: StepPlan, seconds: float) -> float:
        """A roofline step's ``seconds`` with the fit range, page mapping and offload loads."""
        if self.fit_range is not None:
            self.fit_range.step(plan.num_seqs, plan.kv_read_slots + plan.num_batched_tokens)
        if plan.num_mapped_pages or plan.num_unmapped_pages:  # synchronous page mapping
            seconds += self._mapping_seconds(plan)
        if self.offload_load is not None:
            seconds += self._load_seconds(plan)
        return seconds

    def _load_seconds(self, plan: StepPlan) -> float:
        """The step's offload-tier loads (``OffloadLoadCost``), recorded in its column."""
        seconds = self.offload_load.seconds(plan.offload_cpu_slots, plan.offload_disk_slots)
        self.load_column.append(seconds)
        return seconds

    def _mapping_seconds(self, plan: StepPlan) -> float:
        """The driver calls that map and unmap the step's physical pages (vattention)."""
        return plan.num_mapped_pages * self.page_map_s + plan.num_unmapped_pages * self.page_unmap_s

    def decode_durations(self, sum_positions: int, num_seqs: int, span: int,
                         positions: list[int]) -> list[float]:
        """Durations of ``span`` steady decode steps of the sequences at ``positions``
        (tokens computed; they sum to ``sum_positions``), for fast-forwarding (a price
        only: ``decoded_span`` says which of them ran)."""
        extra = (positions,) if self.layers is not None else ()
        if self.operator:
            seconds, columns = self.cost_model.decode_span(sum_positions, num_seqs, span, *extra)
            self._priced = (sum_positions, num_seqs, span, columns)
            return seconds
        return self.cost_model.decode_seconds(sum_positions, num_seqs, span, *extra)

    def decoded_span(self, sum_positions: int, num_seqs: int, span: int,
                     positions: list[int]) -> None:
        """The first ``span`` steps priced by ``decode_durations(sum_positions, num_seqs,
        ..., positions)`` ran (fast-forwarded)."""
        if self.fit_range is not None:
            self.fit_range.decode_span(sum_positions, num_seqs, span)
        if self.offload_load is not None and span > 0:
            self.load_column.extend([0.0] * span)  # decode steps load nothing
        if not self.operator or span <= 0:
            return
        priced_positions, priced_seqs, priced, columns = self._priced
        if priced_positions != sum_positions or priced_seqs != num_seqs or priced < span:
            extra = (positions,) if self.layers is not None else ()
            columns = self.cost_model.decode_span(sum_positions, num_seqs, span, *extra)[1]
        linear, prefill, decode, write, copy, swap, host = columns
        first = len(self.phase_rows) + len(self.span_decodes)  # the span's first step
        self.phase_spans.append((first, span, linear, prefill, write, copy, swap, host))
        # (priced further: only what ran)
        self.span_decodes.fromlist(decode if len(decode) == span else decode[:span])
        # step i reads sum_positions + num_seqs * (i + 1) slots
        self.decode_read_slots += span * sum_positions + num_seqs * span * (span + 1) // 2
        if self._tally is not None:
            for kv_read in range(sum_positions, sum_positions + num_seqs * span, num_seqs):
                self._tally(num_seqs, (kv_read + num_seqs) / num_seqs)

    def phase_columns(self) -> dict[str, np.ndarray | list[float]]:
        """Each phase's seconds per step (``<phase>_s``: [steps] float64), in step order,
        none for the roofline; then ``offload_load_s`` with an offload tier (either model).
        Called once, after the run: it lets go of the steps' phases (a second call has no
        steps)."""
        loads = {"offload_load_s": self.load_column} if self.offload_load is not None else {}
        if not self.operator:
            return loads
        # NOTE: the executed steps' values, then the spans' (a phase's floats repeated
        # over their spans' steps; attention_decode's values as they are), as one
        # [phases, steps] block, laid in step order by one gather: half the CPU of reading
        # seven lists of values per span (Azure conv, 4 systems: 0.22 -> 0.10 s), and no
        # Python float kept per span step while the engine runs
        rows, self.phase_rows = self.phase_rows, []
        spans, self.phase_spans = self.phase_spans, []
        decodes, self.span_decodes = self.span_decodes, array("d")
        # [spans, 2 + phases - 1]: first step, steps (exact as floats), the phases but
        # attention_decode (read as one stream, as the rows are: np.array's walk of a list
        # of tuples took 1 us a span, 0.06 s on Azure conv's four systems)
        width = 1 + len(PHASES)
        spans = np.fromiter(chain.from_iterable(spans), np.float64,
                            width * len(spans)).reshape(len(spans), width)
        firsts, sizes = spans[:, 0].astype(np.int64), spans[:, 1].astype(np.int64)
        executed = len(rows)
        steps = executed + len(decodes)
        values = np.empty((len(PHASES), steps))  # [phases, steps]: the executed, the spans'
        values[:, :executed] = np.fromiter(chain.from_iterable(rows), np.float64,
                                           len(PHASES) * executed).reshape(executed, len(PHASES)).T
        del rows
        constants = iter(spans[:, 2:].T)  # [spans] each, in PHASES order
        for phase, name in enumerate(PHASES):  # the spans' steps
            values[phase, executed:] = (np.frombuffer(decodes, dtype=np.float64)
                                        if name == "attention_decode"
                                        else np.repeat(next(constants), sizes))
        _, span_rows, single = span_layout(firsts, sizes, steps)
        order = np.empty(steps, dtype=np.int64)  # [steps]: each step's place in values
        order[single] = np.arange(executed)
        order[span_rows] = np.arange(executed, steps)
        laid = values.take(order, axis=1)  # (each column contiguous: values[:, order] is not)
        return {**{name: column for name, column in zip(PHASE_COLUMNS, laid)}, **loads}

    def cost_report(self) -> dict:
        """For results.json: the cost model, its profiles and (operator model, a measured
        kernel profile) the decode steps priced beyond the profile's range."""
        model = self.cost_model
        if not self.operator:
            return {"model": "roofline"}
        report = {"model": "operator", "kernel_profile": model.kernel_profile,
                  "host_profile": model.host_profile, "decode_read_slots": self.decode_read_slots}
        kernel_range = model.range_report()
        if kernel_range is not None:
            report["kernel_range"] = kernel_range
        return report
