"""How far a simulated run stays inside the range its calibrated cost model was fitted on.

``python -m harness.tools.calibrate`` fits step times on a grid of batch sizes and context
lengths, and records the grid's largest batch and the largest KV a sequence reached
(``FittedCostSpec.max_batch_size`` / ``max_context_len``). A simulated step priced with
that fit is *beyond* the range when it runs more sequences than that batch, or when its
sequences hold more KV on average than that context: its time is extrapolated. A CPU fit
on contexts up to 192 tokens once predicted 4.2 to 19.4 s for a run of 1,500-3,000-token
prompts measured at 11.3 s, so the run's results say how many steps that was.
"""

from __future__ import annotations

import math


class FitRange:
    """Tallies the steps priced with a fit: how many, how many beyond its range, and the
    largest batch and mean KV per sequence (after the step) seen."""

    __slots__ = ("max_batch_size", "max_context_len", "steps", "steps_beyond", "largest_batch",
                 "largest_context")

    def __init__(self, max_batch_size: int, max_context_len: int) -> None:
        self.max_batch_size = max_batch_size
        self.max_context_len = max_context_len
        self.steps = 0
        self.steps_beyond = 0
        self.largest_batch = 0
        self.largest_context = 0.0

    def step(self, num_seqs: int, kv_slots: int) -> None:
        """One step of ``num_seqs`` sequences holding ``kv_slots`` KV slots after it."""
        if num_seqs <= 0:
            return  # a step that only swaps: no sequence is priced by the fit
        self.steps += 1
        context = kv_slots / num_seqs
        self.largest_batch = max(self.largest_batch, num_seqs)
        self.largest_context = max(self.largest_context, context)
        if num_seqs > self.max_batch_size or kv_slots > self.max_context_len * num_seqs:
            self.steps_beyond += 1

    def decode_span(self, sum_positions: int, num_seqs: int, span: int) -> None:
        """``span`` decode steps of ``num_seqs`` sequences whose positions sum to
        ``sum_positions`` before the first: exactly ``step`` called once per step (step
        ``i`` holds ``sum_positions + num_seqs * (i + 1)`` slots after it)."""
        if num_seqs <= 0 or span <= 0:
            return
        self.steps += span
        self.largest_batch = max(self.largest_batch, num_seqs)
        self.largest_context = max(self.largest_context, (sum_positions + num_seqs * span) / num_seqs)
        if num_seqs > self.max_batch_size:
            self.steps_beyond += span
            return
        # step i is inside iff num_seqs * (i + 1) <= room, i.e. i < room // num_seqs
        room = self.max_context_len * num_seqs - sum_positions
        self.steps_beyond += span - min(span, max(room, 0) // num_seqs)

    def report(self) -> dict:
        """For results.json: the fit's range, what the run reached, and the steps beyond."""
        return {"fitted_max_batch_size": self.max_batch_size,
                "fitted_max_context_len": self.max_context_len,
                "largest_batch": self.largest_batch,
                "largest_mean_context": round(self.largest_context, 1),
                "steps_priced": self.steps, "steps_beyond_fit": self.steps_beyond}


def extrapolation_warnings(systems: dict[str, dict], hardware: str) -> list[str]:
    """One line for the systems (``results.json``'s ``systems``) with steps beyond their
    fit's range, one for those beyond their kernel profile's, or none."""
    return _fit_warnings(systems, hardware) + kernel_range_warnings(systems)


def kernel_range_warnings(systems: dict[str, dict]) -> list[str]:
    """One line for the systems whose decode steps the operator cost model priced beyond
    the kernel profile's measured batches and contexts (held at the edge), or whose block
    size the profile did not measure."""
    ranges = {name: s["cost_model"]["kernel_range"] for name, s in systems.items()
              if (s.get("cost_model") or {}).get("kernel_range")}
    beyond = {name: r for name, r in ranges.items() if r["steps_beyond_profile"]}
    lines = []
    if beyond:
        first = next(iter(beyond.values()))
        counts = ", ".join(f"{name} {r['steps_beyond_profile']:,} of {r['steps_priced']:,} "
                           f"({100 * r['steps_beyond_profile'] / max(r['steps_priced'], 1):.0f}%)"
                           for name, r in beyond.items())
        lines.append(f"decode steps beyond kernel_profile={first['kernel_profile']}'s measured range "
                     f"(batches {first['measured_batches'][0]}-{first['measured_batches'][1]}, "
                     f"mean contexts {first['measured_contexts'][0]:,}-"
                     f"{first['measured_contexts'][1]:,} tokens) were priced at its edge: {counts}; "
                     "measure more points (python -m harness experiment=kernels "
                     "kernel_bench.batch_sizes=[...] kernel_bench.context_lens=[...])")
    notes = sorted({f"{name}: {r['note']}" for name, r in ranges.items() if r.get("note")})
    return lines + [f"kernel profile: {note}" for note in notes]


def _fit_warnings(systems: dict[str, dict], hardware: str) -> list[str]:
    beyond = {name: s["fit_range"] for name, s in systems.items()
              if s.get("fit_range") and s["fit_range"]["steps_beyond_fit"]}
    if not beyond:
        return []
    first = next(iter(beyond.values()))
    counts = ", ".join(f"{name} {fit['steps_beyond_fit']:,} of {fit['steps_priced']:,} "
                       f"({100 * fit['steps_beyond_fit'] / fit['steps_priced']:.0f}%)"
                       for name, fit in beyond.items())
    batch = max(fit["largest_batch"] for fit in beyond.values())
    context = max(fit["largest_mean_context"] for fit in beyond.values())
    batches = ",".join(map(str, covering_grid(batch, 1)))
    contexts = ",".join(map(str, covering_grid(math.ceil(context), 16, align=16)))
    return [f"simulated steps beyond the range hardware={hardware} was calibrated on (batches "
            f"up to {first['fitted_max_batch_size']}, {first['fitted_max_context_len']:,} KV tokens "
            f"per sequence) have extrapolated times: {counts}. This run reached batches of "
            f"{batch} and {context:,.0f} KV tokens per sequence on average: calibrate on a grid "
            f"that covers them (python -m harness.tools.calibrate --batch-sizes {batches} "
            f"--context-lens {contexts} --name {hardware} --force, with the --model and "
            "--hardware the profile was made with)"]


def covering_grid(largest: int, start: int, *, align: int = 1) -> list[int]:
    """Grid points from ``start`` up by factors of 4, ending at ``largest`` rounded up to a
    multiple of ``align``: ``covering_grid(200, 1) == [1, 4, 16, 64, 200]``."""
    top = max(start, -(-largest // align) * align)
    points = []
    while start < top:
        points.append(start)
        start *= 4
    return points + [top]
