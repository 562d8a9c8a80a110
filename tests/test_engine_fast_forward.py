"""Fast-forwarding steady decode steps gives exactly the step-by-step figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engine_helpers import contiguous, engine_spec, make_requests, paged, run


def _workload(seed: int, n: int = 60, gap: float = 0.02, prefix_len: int = 0):
    rng = np.random.default_rng(seed)
    lengths = [(int(p), int(o)) for p, o in zip(rng.integers(1, 300, n), rng.integers(1, 400, n))]
    prefix = np.arange(prefix_len, dtype=np.int32) if prefix_len else None
    if prefix is not None:
        lengths = [(max(p, prefix_len + 1), o) for p, o in lengths]
    return make_requests(lengths, gap=gap, prefix=prefix, seed=seed)


CASES = {
    "paged": (paged(16), {}),
    "paged_prefix": (paged(16, prefix_caching=True), {}),
    "paged_tight_pool": (paged(8), {"kv_capacity_slots": 2048}),
    "paged_block1": (paged(1), {}),
    "oracle": (contiguous("oracle"), {}),
    "max_first_fit": (contiguous("max", "first_fit"), {"kv_capacity_slots": 8192}),
    "static": (paged(16), {"scheduling": "static", "max_num_seqs": 8}),
    "swap": (paged(16), {"kv_capacity_slots": 1024, "preemption": "swap"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("gap", [0.0, 0.05])
def test_fast_forward_matches_step_by_step(case, gap):
    system, overrides = CASES[case]
    requests = _workload(seed=len(case), gap=gap, prefix_len=48 if "prefix" in case else 0)
    base = dict(kv_capacity_slots=4096)
    base.update(overrides)
    slow = run(requests, system, engine_spec(fast_forward=False, **base), max_model_len=1024)
    fast = run(requests, system, engine_spec(fast_forward=True, **base), max_model_len=1024)
    slow_steps, fast_steps = slow.recorder.step_table(), fast.recorder.step_table()
    assert len(slow_steps) == len(fast_steps)
    ints = [c for c in slow_steps.columns if c not in ("time_s", "duration_s")]
    pd.testing.assert_frame_equal(slow_steps[ints], fast_steps[ints])
    np.testing.assert_allclose(fast_steps["time_s"], slow_steps["time_s"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fast_steps["duration_s"], slow_steps["duration_s"], rtol=1e-12)
    assert fast.output_digest == slow.output_digest
    pd.testing.assert_frame_equal(slow.recorder.request_table(), fast.recorder.request_table(),
                                  check_exact=False, rtol=1e-12)
