"""Steps slower than 2x the other steps of their shape: compilation, autotuning or a
capture that landed inside a timed step (or any other stall).

A step's *shape* is what the device launches: a prefill step's token count (its GEMMs'
rows; power-of-two bucket) or a decode step's batch (its CUDA graph bucket; power-of-two
bucket). A step is flagged when it took more than ``FACTOR`` times the median of the
other steps of its shape (at least ``MIN_PEERS`` of them). The torch executor reports the
flagged steps (results.json ``executor.slow_steps``, and on the console); the fits of
``harness.tools.calibrate_runs`` leave them out.
"""

from __future__ import annotations

import numpy as np

FACTOR = 2.0
MIN_PEERS = 2


def _bucket(value: int) -> int:
    return 1 << max(int(value), 1).bit_length() - 1


def step_shape(num_tokens: int, num_seqs: int, num_prefill_tokens: int) -> tuple[str, int]:
    """("prefill", token bucket) or ("decode", batch bucket)."""
    if num_prefill_tokens > 0:
        return "prefill", _bucket(num_tokens)
    return "decode", _bucket(num_seqs)


def slow_steps(durations, shapes: list[tuple[str, int]], factor: float = FACTOR) -> list[dict]:
    """The steps (index, shape, seconds, the peers' median) slower than ``factor`` x the
    median of the other steps of the same shape."""
    durations = np.asarray(durations, dtype=np.float64)  # [steps]
    by_shape: dict[tuple[str, int], list[int]] = {}
    for i, shape in enumerate(shapes):
        by_shape.setdefault(shape, []).append(i)
    flagged = []
    for shape, idx in by_shape.items():
        if len(idx) <= MIN_PEERS:
            continue
        values = durations[idx]
        for k, i in enumerate(idx):
            peers = np.delete(values, k)
            median = float(np.median(peers))
            if durations[i] > factor * median:
                flagged.append({"step": int(i), "phase": shape[0], "bucket": int(shape[1]),
                                "seconds": round(float(durations[i]), 6),
                                "peers_median_s": round(median, 6),
                                "ratio": round(float(durations[i]) / median, 2)})
    return sorted(flagged, key=lambda row: row["step"])


def flag_table(steps) -> list[dict]:
    """``slow_steps`` of a steps_*.csv table (columns duration_s, num_batched_tokens,
    num_seqs, num_prefill_tokens)."""
    shapes = [step_shape(t, n, p) for t, n, p in zip(steps["num_batched_tokens"], steps["num_seqs"],
                                                     steps["num_prefill_tokens"])]
    return slow_steps(steps["duration_s"].to_numpy(), shapes)
