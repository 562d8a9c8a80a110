"""The report figures read the right way: n/a where a quantity does not apply, legends that
match what they label, sweep axes ticked at the swept values, rounded waste."""

from __future__ import annotations

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd

from pagebench.reports import figures as F
from pagebench.reports.metrics import waste_pct
from pagebench.reports.render import _prefix_hit_rate, _sharing_savings, _usage_over_time
from pagebench.reports.sweep import sweep_figure

PAGED = {"allocator": {"kind": "paged", "prefix_caching": True},
         "memory": {"sharing_savings_pct": 33.6}, "prefix_cache": {"hit_rate": 0.5}}
MAX = {"allocator": {"kind": "contiguous", "prefix_caching": False},
       "memory": {"sharing_savings_pct": 0.0}, "prefix_cache": {"hit_rate": 0.0}}


def test_contiguous_systems_read_n_a_for_sharing_and_prefix_hits_not_zero():
    assert (_sharing_savings(PAGED), _prefix_hit_rate(PAGED)) == (33.6, 50.0)
    assert (_sharing_savings(MAX), _prefix_hit_rate(MAX)) == (None, None)
    systems = {"paged": PAGED, "max": MAX, "pow2": MAX, "oracle": MAX}
    colors = F.system_colors(list(systems))
    fig = F.panel_bars(systems, [("a (%)", lambda s: 1.0), ("b (%)", lambda s: 2.0),
                                 ("sharing (%)", _sharing_savings), ("hits (%)", _prefix_hit_rate)],
                       "t", colors)
    hits = fig.axes[3]
    assert [t.get_text() for t in hits.get_xticklabels()] == list(systems)  # every system named
    assert [(round(t.get_position()[0]), t.get_text()) for t in hits.texts] == \
        [(1, "n/a"), (2, "n/a"), (3, "n/a")]
    # four panels sit two to a row (not four in a cramped row), and need no legend: the tick
    # labels name the bars
    assert len({round(ax.get_position().y0, 3) for ax in fig.axes}) == 2
    assert fig.legends == []


def test_the_block_level_legend_is_neutral_grey_not_the_first_systems_colour():
    steps = {name: pd.DataFrame({"time_s": np.arange(5.0), "allocated_slots": [0, 4, 8, 8, 2],
                                 "token_states": [0, 2, 5, 7, 1]}) for name in ("paged", "max")}
    colors = F.system_colors(list(steps))
    fig = _usage_over_time(steps, {n: 10.0 for n in steps}, colors)
    (legend,) = fig.legends
    keys = [mcolors.to_hex(h.get_facecolor() if hasattr(h, "get_facecolor") and not
                           hasattr(h, "get_xdata") else h.get_color())
            for h in legend.legend_handles]
    assert not set(keys) & {mcolors.to_hex(c) for c in colors.values()}


def sweep_frame(key: str, values: list) -> pd.DataFrame:
    return pd.DataFrame([{"system": s, key: v, "status": "finished", "waste_pct": 10.0 + i}
                         for s in ("paged", "max") for i, v in enumerate(values)])


def test_sweep_axes_tick_at_the_swept_values():
    for key, values in (("block_size", [1, 2, 4, 8, 16, 32, 64, 128, 256]),
                        ("workload.arrival.rate", [0.5, 1.0, 1.5, 2.5]),
                        ("engine.max_num_seqs", [8, 40, 200, 1000])):
        frame = sweep_frame(key, values)
        fig = sweep_figure(frame, key, [], [("waste_pct", "waste (%)")],
                           F.system_colors(["paged", "max"]))
        ax = fig.axes[0]
        assert list(ax.get_xticks()) == [float(v) for v in values], key
        assert [t.get_text() for t in ax.get_xticklabels()] == [f"{v:g}" for v in values], key


def test_waste_is_rounded_like_the_percentages_it_is_made_of():
    value = waste_pct({"memory": {"token_states_pct": 59.4123, "idle_pct": 4.3321}})
    assert value == round(100 * (1 - 59.4123 / (100 - 4.3321)), 4)
    assert len(repr(value).split(".")[1]) <= 4
