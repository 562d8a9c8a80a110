"""The two cost models for a model whose layers are not all full attention (sliding
window, MLA, linear attention: ``harness.engine.cost_layers``): the same phases and
roofline as ``OperatorCostModel`` and ``RooflineCostModel``, with the attention and KV
write terms a layer group at a time. ``make_cost_model`` picks them when
``layered_attention(model)`` is not None; a uniform model never reaches this module.

Each prices a step from ``plan_work``'s integers, and a fast-forwarded decode span from
the same integers step by step (``decode_work``; the sliding layers' reads from
``WindowSpan``), through the same method: bulk and single steps agree bit for bit.
"""

from __future__ import annotations

from harness.config.parallelism import AllReduceCost
from harness.config.specs import CostSpec, HardwareSpec, ModelSpec
from harness.engine.cost_layers import LayeredAttention, WindowSpan, decode_work
from harness.engine.cost_operator import HOST_LINK_GBPS, PHASES, OperatorCostModel, step_seconds
from harness.engine.sim_executor import RooflineCostModel, StepCost

_PREFILL, _DECODE, _WRITE = (PHASES.index(p) for p in ("attention_prefill", "attention_decode",
                                                        "kv_write"))


def _window_slots(positions: list[int], layers: LayeredAttention):
    """Step i's sliding-layer decode reads along a span of the sequences at ``positions``
    (0 for a model without sliding layers)."""
    if not layers.window:
        return lambda step: 0
    return WindowSpan(positions, layers.window).slots


class LayeredOperatorCostModel(OperatorCostModel):
    """``OperatorCostModel`` with per-group attention: ``attention_prefill`` = the full /
    MLA causal pairs, the sliding layers' windowed pairs and the linear layers' tokens at
    the effective peak, plus each prefilled sequence's state read; ``attention_decode`` =
    max(the KV the decodes read at the kernel profile's bandwidth, their FLOPs at the
    effective peak), plus each decode's state read; ``kv_write`` = the computed tokens' KV
    and each computed sequence's state."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, cost: CostSpec, layout: str,
                 block_size: int | None, layers: LayeredAttention,
                 swap_bandwidth_gbps: float = HOST_LINK_GBPS,
                 allreduce: AllReduceCost | None = None) -> None:
        super().__init__(model, hardware, cost, layout, block_size, swap_bandwidth_gbps,
                         allreduce)
        self.layers = layers
        peak, bandwidth = self.peak_flops, self.bandwidth
        spec_bandwidth = hardware.hbm_bandwidth_gbps * 1e9
        self.prefill_pair_s = layers.prefill_pair_flops / peak
        self.window_pair_s = layers.window_pair_flops / peak
        self.linear_token_s = layers.linear_token_flops / peak
        self.decode_pair_flop_s = layers.decode_pair_flops / peak
        self.context_read_s = layers.context_bytes / spec_bandwidth  # before the kernel's efficiency
        self.window_read_s = layers.window_bytes / spec_bandwidth
        self.state_s = layers.state_bytes / bandwidth  # read or written once
        self.token_write_s = layers.kv_write_bytes / bandwidth

    def layered_phases(self, tokens: int, work: tuple[int, ...], copied_slots: int,
                       swapped_slots: int, num_seqs: int) -> tuple[float, ...]:
        """Seconds of each of ``PHASES`` for one step of ``plan_work``'s ``work``."""
        (prefill_pairs, prefill_window, prefill_seqs, prefill_tokens, decode_pairs,
         decode_window, decode_seqs, _) = work
        phases = list(self.phases(tokens, 0, 0, 0, copied_slots, swapped_slots, num_seqs))
        phases[_PREFILL] = (prefill_pairs * self.prefill_pair_s + prefill_window * self.window_pair_s
                            + prefill_tokens * self.linear_token_s + prefill_seqs * self.state_s)
        if decode_seqs:
            efficiency = self.efficiency.constant or self.efficiency(decode_seqs,
                                                                     decode_pairs / decode_seqs)
            read = (decode_pairs * self.context_read_s + decode_window * self.window_read_s) / efficiency
            compute = (decode_pairs * self.decode_pair_flop_s + decode_window * self.window_pair_s
                       + (tokens - prefill_tokens) * self.linear_token_s)
            phases[_DECODE] = (read if read >= compute else compute) + decode_seqs * self.state_s
        phases[_WRITE] = tokens * self.token_write_s + num_seqs * self.state_s
        return tuple(phases)

    def decode_span(self, sum_positions: int, num_seqs: int, span: int,
                    positions: list[int]) -> tuple[list[float], tuple[float | list[float], ...]]:
        """``OperatorCostModel.decode_span`` for the sequences at ``positions`` (their
        tokens computed before the span; they sum to ``sum_positions``)."""
        window_slots = _window_slots(positions, self.layers)
        rows = [self.layered_phases(num_seqs, decode_work(sum_positions + num_seqs * (i + 1),
                                                          window_slots(i), num_seqs),
                                    0, 0, num_seqs) for i in range(span)]
        # (only the decode phase moves along a decode span: the others are every step's)
        linear, prefill, _, write, copy, swap, host = rows[0] if rows else (0.0,) * len(PHASES)
        decode = [row[_DECODE] for row in rows]
        return [step_seconds(row) for row in rows], (linear, prefill, decode, write, copy, swap, host)


class LayeredRooflineCostModel(RooflineCostModel):
    """``RooflineCostModel`` with per-group attention: FLOPs of the full / MLA pairs
    (prefill and decode apart: MLA decodes absorbed), the sliding layers' windowed pairs
    and the linear layers' tokens; bytes of the full / MLA layers' context read and token
    writes, the sliding layers' windowed read and writes, and each sequence's linear state
    read and written. A calibrated fit of the model prices as ``RooflineCostModel``."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, cost: CostSpec,
                 layers: LayeredAttention, swap_bandwidth_gbps: float = HOST_LINK_GBPS,
                 layout: str = "paged") -> None:
        super().__init__(model, hardware, cost, swap_bandwidth_gbps, layout)
        self.layers = layers

    def layered_step_cost(self, num_tokens: int, attention_pairs: int, kv_read_slots: int,
                          work: tuple[int, ...], copied_slots: int = 0, swapped_slots: int = 0,
                          num_seqs: int = 0, num_prefill_chunks: int = 0) -> StepCost:
        if self.fit is not None:
            return self.step_cost(num_tokens, attention_pairs, kv_read_slots, copied_slots,
                                  swapped_slots, num_seqs, num_prefill_chunks)
        layers = self.layers
        prefill_pairs, prefill_window, _, _, decode_pairs, decode_window, _, window_read = work
        flops = (self.flops_per_token * num_tokens + layers.prefill_pair_flops * prefill_pairs
                 + layers.decode_pair_flops * decode_pairs
                 + layers.window_pair_flops * (prefill_window + decode_window)
                 + layers.linear_token_flops * num_tokens)
        moved = (self.weight_bytes + layers.context_bytes * (kv_read_slots + num_tokens)
                 + layers.window_bytes * (window_read + num_tokens)
                 + 2.0 * layers.state_bytes * num_seqs + 2.0 * self.bytes_per_slot * copied_slots)
        seconds = self.overhead + max(flops / self.peak_flops, moved / self.bandwidth)
        seconds += self.bytes_per_slot * swapped_slots / self.swap_bandwidth
        return StepCost(seconds, flops, moved)

    def decode_seconds(self, sum_positions: int, num_seqs: int, span: int,
                       positions: list[int]) -> list[float]:
        """``RooflineCostModel.decode_seconds`` for the sequences at ``positions``."""
        if self.fit is not None:
            return super().decode_seconds(sum_positions, num_seqs, span)
        window_slots = _window_slots(positions, self.layers)
        step = self.layered_step_cost
        seconds = []
        for i in range(span):
            kv_read = sum_positions + num_seqs * i
            work = decode_work(kv_read + num_seqs, window_slots(i), num_seqs)
            seconds.append(step(num_seqs, kv_read + num_seqs, kv_read, work, 0, 0, num_seqs, 0).seconds)
        return seconds
