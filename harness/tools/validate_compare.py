"""The arithmetic of ``python -m harness.tools.validate``: a system's figures from its
results.json entry and step table, their sim/measured errors, and the steps compared by
phase and by batch / context bucket.

Errors are signed, relative to the measurement: ``100 * (predicted - measured) / measured``.
Steps are paired by index when the two runs scheduled the same steps (the scheduler's
decisions do not depend on step times in an offline run, so the sim replays the measured
schedule); otherwise each bucket's means are compared unpaired.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

# (key in the comparison, label, where in a results.json system entry)
RUN_METRICS = (
    ("requests_per_s", "req/s", ("throughput", "requests_per_s")),
    ("output_tokens_per_s", "output tok/s", ("throughput", "output_tokens_per_s")),
    ("mean_batch", "mean batch", ("batch", "mean_seqs")),
    ("ttft_p50_s", "TTFT p50 (s)", ("latency", "ttft_s", "p50")),
    ("ttft_p99_s", "TTFT p99 (s)", ("latency", "ttft_s", "p99")),
    ("tpot_p50_s", "TPOT p50 (s)", ("latency", "tpot_s", "p50")),
)
STEP_METRICS = (("decode_step_mean_s", "mean decode step (s)"),
                ("prefill_step_mean_s", "mean prefill step (s)"))
# the targets: |error| bounds in percent
TARGETS_PCT = {"requests_per_s": 10.0, "decode_step_mean_s": 10.0, "ttft_p50_s": 20.0}
SIGNATURE = ("num_seqs", "num_batched_tokens", "num_prefill_tokens")


def error_pct(predicted: float | None, measured: float | None) -> float | None:
    """Signed error of ``predicted`` against ``measured`` in percent (None when undefined)."""
    if predicted is None or measured is None or not measured or not math.isfinite(measured):
        return None
    return round(100.0 * (predicted - measured) / measured, 2)


def _dig(entry: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(entry, dict):
            return None
        entry = entry.get(key)
    return entry if isinstance(entry, (int, float)) and not isinstance(entry, bool) else None


def system_figures(entry: dict, steps: pd.DataFrame) -> dict:
    """The compared figures of one system: ``RUN_METRICS`` from its results.json entry and
    the mean decode / prefill step time from its step table."""
    out = {key: _dig(entry, path) for key, _label, path in RUN_METRICS}
    decode = steps["num_prefill_tokens"] == 0
    out["decode_step_mean_s"] = float(steps.loc[decode, "duration_s"].mean()) if decode.any() else None
    out["prefill_step_mean_s"] = float(steps.loc[~decode, "duration_s"].mean()) if (~decode).any() else None
    return out


def compare_figures(predicted: dict, measured: dict) -> dict:
    """``{key: {"measured", "predicted", "error_pct", "within_target"}}`` per figure."""
    out = {}
    for key in [k for k, _l, _p in RUN_METRICS] + [k for k, _l in STEP_METRICS]:
        err = error_pct(predicted.get(key), measured.get(key))
        target = TARGETS_PCT.get(key)
        out[key] = {"measured": measured.get(key), "predicted": predicted.get(key), "error_pct": err,
                    "target_pct": target,
                    "within_target": None if target is None or err is None else abs(err) <= target}
    return out


def pow2_bucket(value: float) -> int:
    """The power of two at or below ``value`` (>= 1): the bucket 8 holds 8..15."""
    return 1 << max(int(value), 1).bit_length() - 1


def step_buckets(steps: pd.DataFrame) -> pd.DataFrame:
    """Each step's phase (prefill when it computes prompt tokens), batch bucket (sequences)
    and context bucket (decode: KV held per sequence; prefill: tokens computed)."""
    phase = np.where(steps["num_prefill_tokens"] > 0, "prefill", "decode")
    per_seq = steps["token_states"] / steps["num_seqs"].clip(lower=1)
    context = np.where(phase == "prefill", steps["num_batched_tokens"], per_seq)
    return pd.DataFrame({"phase": phase,
                         "batch_bucket": [pow2_bucket(v) for v in steps["num_seqs"]],
                         "context_bucket": [pow2_bucket(v) for v in context]})


def paired(predicted: pd.DataFrame, measured: pd.DataFrame) -> bool:
    """Whether the two step tables ran the same steps (the shorter one a prefix of the other)."""
    n = min(len(predicted), len(measured))
    return n > 0 and bool((predicted[list(SIGNATURE)].iloc[:n].to_numpy()
                           == measured[list(SIGNATURE)].iloc[:n].to_numpy()).all())


def compare_steps(predicted: pd.DataFrame, measured: pd.DataFrame) -> dict:
    """Step durations predicted against measured, by (phase, batch bucket, context bucket).

    Paired (same schedule): each measured step against the sim's step of the same index,
    plus the pairs themselves for the scatter. Unpaired: each bucket's mean against the
    other run's mean in the same bucket.
    """
    is_paired = paired(predicted, measured)
    if is_paired:
        n = min(len(predicted), len(measured))
        predicted, measured = predicted.iloc[:n], measured.iloc[:n]
    rows = []
    if is_paired:
        frame = step_buckets(measured).assign(measured_s=measured["duration_s"].to_numpy(),
                                              predicted_s=predicted["duration_s"].to_numpy())
        groups = frame.groupby(["phase", "batch_bucket", "context_bucket"], sort=True)
        for (phase, batch, context), g in groups:
            rel = (g["predicted_s"] - g["measured_s"]) / g["measured_s"]
            rows.append({"phase": phase, "batch_bucket": int(batch), "context_bucket": int(context),
                         "steps": int(len(g)), "measured_mean_s": round(float(g["measured_s"].mean()), 6),
                         "predicted_mean_s": round(float(g["predicted_s"].mean()), 6),
                         "error_pct": error_pct(float(g["predicted_s"].mean()), float(g["measured_s"].mean())),
                         "median_abs_step_error_pct": round(float(np.median(np.abs(rel)) * 100), 2)})
        points = [[round(float(m), 6), round(float(p), 6), ph] for m, p, ph
                  in zip(frame["measured_s"], frame["predicted_s"], frame["phase"])]
    else:
        keys = ["phase", "batch_bucket", "context_bucket"]
        m = step_buckets(measured).assign(s=measured["duration_s"].to_numpy()).groupby(keys)["s"].agg(["mean", "size"])
        p = step_buckets(predicted).assign(s=predicted["duration_s"].to_numpy()).groupby(keys)["s"].agg(["mean", "size"])
        both = m.merge(p, left_index=True, right_index=True, suffixes=("_m", "_p"))
        for (phase, batch, context), r in both.iterrows():
            rows.append({"phase": phase, "batch_bucket": int(batch), "context_bucket": int(context),
                         "steps": int(r["size_m"]), "predicted_steps": int(r["size_p"]),
                         "measured_mean_s": round(float(r["mean_m"]), 6),
                         "predicted_mean_s": round(float(r["mean_p"]), 6),
                         "error_pct": error_pct(float(r["mean_p"]), float(r["mean_m"]))})
        points = [[r["measured_mean_s"], r["predicted_mean_s"], r["phase"]] for r in rows]
    by_phase = {}
    for phase in ("prefill", "decode"):
        sel = [r for r in rows if r["phase"] == phase]
        steps = sum(r["steps"] for r in sel)
        if steps:
            measured_total = sum(r["measured_mean_s"] * r["steps"] for r in sel)
            predicted_total = sum(r["predicted_mean_s"] * r["steps"] for r in sel)
            by_phase[phase] = {"steps": steps, "measured_s": round(measured_total, 5),
                               "predicted_s": round(predicted_total, 5),
                               "error_pct": error_pct(predicted_total, measured_total)}
    return {"paired": is_paired, "measured_steps": int(len(measured)),
            "predicted_steps": int(len(predicted)), "by_phase": by_phase, "buckets": rows,
            "points": points}
