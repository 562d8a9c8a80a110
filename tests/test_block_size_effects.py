"""The block-size report's two effects, from hand-made system summaries."""

from __future__ import annotations

from pagebench.reports.block_size_effects import effect_rows, effects_section, explain


def _summary(block: int, kernel_s: float, read: int, rounding: float, batch: float,
             preemptions: int, latency: float) -> dict:
    return {"allocator": {"kind": "paged", "block_size": block},
            "cost_model": {"model": "operator", "decode_read_slots": read},
            "time_by_phase_s": {"attention_decode": kernel_s},
            "memory": {"internal_rounding_pct": rounding}, "batch": {"mean_seqs": batch},
            "preemptions": preemptions, "latency": {"normalized_s_per_token": {"mean": latency}}}


POINTS = [(16, _summary(16, 2.0, 10**9, 1.5, 30.0, 0, 0.04)),
          (1, _summary(1, 4.0, 10**9, 0.0, 31.0, 900, 0.15)),
          (256, _summary(256, 1.8, 10**9, 20.0, 12.0, 300, 0.09))]


def test_rows_give_the_kernel_cost_per_kv_token_and_the_memory_figures_in_block_order():
    rows = effect_rows(POINTS)
    assert [r["block_size"] for r in rows] == [1, 16, 256]
    assert [r["kernel_ns_per_token"] for r in rows] == [4.0, 2.0, 1.8]  # 1e9 * s / slots
    assert [r["rounding_pct"] for r in rows] == [0.0, 1.5, 20.0]


def test_the_explanation_names_the_optimum_and_the_effect_on_each_side():
    text = explain(effect_rows(POINTS))
    assert text.startswith("Lowest normalized latency at block 16")
    assert "time effect dominates: the decode kernel takes 2.00x as long per KV token at block 1" in text
    assert "memory effect dominates: block rounding holds 20.00% of the pool at block 256" in text
    assert "mean batch is 12.0 vs 30.0" in text


def test_runs_without_the_operator_model_say_the_section_is_absent():
    plain = [(b, {k: v for k, v in s.items() if k != "cost_model"}) for b, s in POINTS]
    assert "needs two or more block sizes priced by engine.cost.model=operator" in effects_section(plain, "x")
