"""The calibration's fit: step-time coefficients from measured steps, with the linear
layers' roofline max.

Step time = step_overhead_s + max(per_token_s * tokens, linear_floor_s)
+ per_attention_pair_s * pairs + per_kv_read_slot_s * cached slots read
+ per_seq_s * sequences + per_prefill_chunk_s * prefill chunks.

The max is the linear layers' roofline: below ``linear_floor_s / per_token_s`` tokens a
step reads the weights (memory-bound, a floor); above it, it computes (per token). A plain
linear fit cannot express it; here the knee is searched over the measured token counts,
and for each candidate knee ``k`` the rest is a non-negative least-squares fit in relative
error with the feature ``max(tokens, k)`` (so ``linear_floor_s = per_token_s * k``); the
knee with the smallest error wins (knee 0: the plain linear fit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FEATURES = ("const", "num_tokens", "attention_pairs", "kv_read_slots", "num_seqs", "num_prefill_chunks")
COEFFICIENTS = ("step_overhead_s", "per_token_s", "per_attention_pair_s", "per_kv_read_slot_s",
                "per_seq_s", "per_prefill_chunk_s")


@dataclass(frozen=True)
class Sample:
    """One measured step: the cost model's features and the measured seconds."""

    point: tuple[int, int]  # (batch size, context length) of the run it came from
    num_tokens: int
    attention_pairs: float
    kv_read_slots: int
    num_seqs: int
    num_prefill_chunks: int
    seconds: float

    def features(self, knee: float = 0.0) -> list[float]:
        return [1.0, max(self.num_tokens, knee), self.attention_pairs, self.kv_read_slots,
                self.num_seqs, self.num_prefill_chunks]



def _nnls(samples: list[Sample], knee: float) -> tuple[np.ndarray, float]:
    """Coefficients at ``knee`` and their sum of squared relative errors."""
    from scipy.optimize import nnls

    X = np.asarray([s.features(knee) for s in samples], dtype=np.float64)  # [n, features]
    y = np.asarray([s.seconds for s in samples], dtype=np.float64)  # [n]
    w = 1.0 / np.maximum(y, 1e-9)
    scale = np.maximum(np.abs(X).max(axis=0), 1.0)  # column scaling for conditioning
    coef, _ = nnls((X * w[:, None]) / scale, y * w)
    coef = coef / scale
    return coef, float((((X @ coef) - y) * w) @ (((X @ coef) - y) * w))


def fit_coefficients(samples: list[Sample], *, with_floor: bool = False) -> np.ndarray:
    """``COEFFICIENTS`` fitted to ``samples`` (all >= 0); with ``with_floor``, followed by
    ``linear_floor_s`` from the knee search (see the module docstring)."""
    coef, error = _nnls(samples, 0.0)
    if not with_floor:
        return coef
    knee = 0.0
    for candidate in sorted({float(s.num_tokens) for s in samples}):
        trial, trial_error = _nnls(samples, candidate)
        if trial_error < error * (1 - 1e-9):
            coef, error, knee = trial, trial_error, candidate
    return np.append(coef, coef[1] * knee)


def predict(coef: np.ndarray, samples: list[Sample]) -> np.ndarray:
    """Predicted seconds of ``samples`` (``coef``: ``COEFFICIENTS``, optionally + the floor)."""
    floor = float(coef[len(FEATURES)]) if len(coef) > len(FEATURES) else 0.0
    knee = floor / coef[1] if floor > 0 and coef[1] > 0 else 0.0
    X = np.asarray([s.features(knee) for s in samples], dtype=np.float64).reshape(-1, len(FEATURES))
    return X @ coef[:len(FEATURES)]


def relative_errors(coef: np.ndarray, samples: list[Sample]) -> np.ndarray:
    y = np.asarray([s.seconds for s in samples], dtype=np.float64)
    return (predict(coef, samples) - y) / y


def error_summary(errors: np.ndarray) -> dict:
    if errors.size == 0:
        return {"count": 0}
    a = np.abs(errors) * 100
    return {"count": int(a.size), "median_abs_pct": round(float(np.median(a)), 2),
            "p90_abs_pct": round(float(np.percentile(a, 90)), 2),
            "mean_signed_pct": round(float(errors.mean() * 100), 2)}
