"""Serving latency as ``vllm bench serve`` reports it, and goodput at an SLO.

Per finished request: TTFT (first token - arrival), TPOT ((E2E - TTFT) / (n - 1), for
outputs of n > 1 tokens), E2EL (finish - arrival); per output token after the first,
ITL (the gap between a request's consecutive output tokens: its TPOT is their mean).
Each as ``mean_/median_/std_/p<P>_<metric>_ms`` (vLLM's ``calculate_metrics`` names; P
from ``slo.percentiles``, ``p99.9`` for a fractional one).

Goodput (DistServe; vLLM's ``--goodput ttft:MS tpot:MS e2el:MS``): a finished request is
good when it meets every target set; a one-token output counts as TPOT 0 (the TPOT
target does not apply to it). ``request_goodput`` = good requests per second of the run
(its makespan, as ``request_throughput``); ``slo_attainment`` = good requests / all
requests of the workload (a rejected or unfinished request never meets its SLO).

Token times in the simulator: a request's tokens come at the ends of the steps that
produce them. A running single-sequence request produces one token in every step
except those ``SequenceGroup.token_breaks`` records (preempted, or waiting for the token
budget), so its last token of each stretch is at the end of the step before the break
and the stretch's tokens are in the steps just before it (the last stretch ends at its
finish). ``inter_token_latencies`` rebuilds every token's step from that, exactly.
Requests of several sequences (parallel sampling, beams) have no single token stream:
they are left out of the ITL figures (their TPOT and E2EL count).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import pandas as pd

METRICS = ("ttft", "tpot", "itl", "e2el")


def _step_of(ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The index of the step that ends at each of ``times`` (every one a step's end)."""
    index = np.searchsorted(ends, times)
    if len(times) and (index.max() >= len(ends) or not np.array_equal(ends[index], times)):
        raise RuntimeError("a token time is not the end of a recorded step")  # invariant
    return index


def token_steps(ends: np.ndarray, first_s: float, finish_s: float, output_len: int,
                breaks: Iterable[tuple[float, int]]) -> np.ndarray:
    """The steps (indices into ``ends``, each step's end time) in which one request
    produced its ``output_len`` tokens, given its first token and finish times and its
    ``token_breaks``: [output_len] int64, ascending."""
    runs = []
    done = 0
    for start_s, count in breaks:
        if count > done:  # tokens done .. count - 1, in the steps up to the break's
            last = int(_step_of(ends, np.array([start_s]))[0])
            runs.append(np.arange(last - (count - done) + 1, last + 1))
            done = count
    last = int(_step_of(ends, np.array([finish_s]))[0])
    runs.append(np.arange(last - (output_len - done) + 1, last + 1))
    steps = np.concatenate(runs)
    first = int(_step_of(ends, np.array([first_s]))[0])
    if steps[0] != first or (len(steps) > 1 and np.diff(steps).min() < 1):
        raise RuntimeError("token breaks disagree with the first token's step")  # invariant
    return steps


def broken_token_gaps(ends: np.ndarray, first: np.ndarray, finish_s: np.ndarray,
                      lengths: np.ndarray, breaks: list[list[tuple[float, int]]]) -> np.ndarray:
    """The token gaps of requests with token breaks, in seconds, request after request:
    what ``np.diff(ends[token_steps(...)])`` gives for each, concatenated. ``first``: each
    request's first token's step; ``finish_s``, ``lengths``: its finish time and output
    length; ``breaks``: its ``token_breaks``. [sum of (n - 1)] float64.

    NOTE: one pass over all requests' stretches in numpy (a preempting replay has thousands
    of such requests: ``token_steps`` per request cost 0.1 s on Azure conv's paged run).
    """
    # stretches: each request's tokens come in runs of consecutive steps, the run ending
    # at a break's step (its tokens done .. count - 1) or at the finish (the rest)
    stretches: list[tuple[float, int]] = []  # (its last step's end, its tokens)
    per_request = []  # [requests]: how many tokens its stretches hold
    for request_breaks, finish, length in zip(breaks, finish_s.tolist(), lengths.tolist()):
        done = 0
        for start_s, count in request_breaks:
            if count > done:
                stretches.append((start_s, count - done))
                done = count
        stretches.append((finish, max(length - done, 0)))
        per_request.append(max(length, done))
    if not per_request:
        return np.zeros(0)
    if min(per_request) < 1:
        raise RuntimeError("a finished request without a token")  # invariant
    end_s, size = zip(*stretches)
    last = _step_of(ends, np.array(end_s, dtype=float))  # [stretches]
    size_of = np.array(size, dtype=np.int64)  # [stretches]
    offsets = np.cumsum(size_of) - size_of  # where each stretch's tokens start
    steps = np.repeat(last - size_of + 1 - offsets, size_of) + np.arange(int(size_of.sum()))
    tokens = np.array(per_request, dtype=np.int64)  # [requests]
    starts = np.cumsum(tokens) - tokens  # where each request's tokens start in ``steps``
    same = np.ones(len(steps), dtype=bool)  # [tokens]: the token after is the same request's
    same[starts[1:] - 1] = False
    same[-1] = False
    if not np.array_equal(steps[starts], first) or np.any(np.diff(steps)[same[:-1]] < 1):
        raise RuntimeError("token breaks disagree with the first token's step")  # invariant
    token_at = ends[steps]
    return (token_at[1:] - token_at[:-1])[same[:-1]]


def inter_token_latencies(steps: pd.DataFrame, requests: pd.DataFrame,
                          token_breaks: Mapping[int, list] | None = None) -> np.ndarray:
    """Every gap between consecutive output tokens of the finished single-sequence
    requests, in seconds: [sum of (n - 1)] float64 (the requests without token breaks
    first, in table order, then the others)."""
    if "replica" in steps.columns:  # engine.replicas (harness.engine.replicas): each its own steps
        return np.concatenate([np.zeros(0)] + [
            inter_token_latencies(steps[steps["replica"] == r].drop(columns="replica"),
                                  requests[requests["replica"] == r], token_breaks)
            for r in sorted(set(steps["replica"]))])
    done = requests[(requests["status"] == "finished") & (requests["num_seqs"] == 1)]
    if not len(done) or not len(steps):
        return np.zeros(0)
    ends = steps["time_s"].to_numpy(dtype=float) + steps["duration_s"].to_numpy(dtype=float)
    gap_after = np.diff(ends)  # [steps - 1]: gap_after[j] = ends[j + 1] - ends[j]
    token_breaks = token_breaks or {}
    ids = done["request_id"].to_numpy()
    lengths = done["output_len"].to_numpy(dtype=np.int64)
    last = _step_of(ends, done["finish_s"].to_numpy(dtype=float))
    first = _step_of(ends, done["first_token_s"].to_numpy(dtype=float))
    broken = (np.isin(ids, np.fromiter(token_breaks, dtype=ids.dtype, count=len(token_breaks)))
              if token_breaks else np.zeros(len(ids), dtype=bool))
    # the others: one token per step from first to last, so their gaps are
    # gap_after[first .. last - 1], gathered in one index array
    plain_first, plain_last = first[~broken], last[~broken]
    counts = plain_last - plain_first
    if not np.array_equal(counts, lengths[~broken] - 1):
        raise RuntimeError("a request's tokens are not one per step")  # invariant
    offsets = np.cumsum(counts) - counts  # where each request's gaps start in the output
    index = np.repeat(plain_first - offsets, counts) + np.arange(int(counts.sum()))
    first_s = done["first_token_s"].to_numpy(dtype=float)
    finish_s = done["finish_s"].to_numpy(dtype=float)
    return np.concatenate([gap_after[index],
                           broken_token_gaps(ends, first[broken], finish_s[broken], lengths[broken],
                                             [token_breaks[int(i)] for i in ids[broken]])])


def inter_token_gap_counts(steps: pd.DataFrame, requests: pd.DataFrame,
                           token_breaks: Mapping[int, list] | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
    """The multiset ``inter_token_latencies`` returns, without writing it out: (gaps,
    counts), each gap in seconds with how many times it occurs: [k] float64, [k] int64.

    A request without token breaks has the gap between every two consecutive steps from
    its first token's to its last's, so a step gap's count is the number of such requests
    spanning it (a difference array over [first, last)); the few broken requests add
    their own gaps, once each. A long trace has millions of token gaps over a few
    thousand step gaps: the summary's percentiles then sort the step gaps, not the tokens.
    """
    if "replica" in steps.columns:  # each replica over its own steps
        parts = [inter_token_gap_counts(steps[steps["replica"] == r].drop(columns="replica"),
                                        requests[requests["replica"] == r], token_breaks)
                 for r in sorted(set(steps["replica"]))]
        return (np.concatenate([np.zeros(0)] + [g for g, _ in parts]),
                np.concatenate([np.zeros(0, dtype=np.int64)] + [c for _, c in parts]))
    done = requests[(requests["status"] == "finished") & (requests["num_seqs"] == 1)]
    if not len(done) or not len(steps):
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    ends = steps["time_s"].to_numpy(dtype=float) + steps["duration_s"].to_numpy(dtype=float)
    gap_after = np.diff(ends)  # [steps - 1]
    token_breaks = token_breaks or {}
    ids = done["request_id"].to_numpy()
    lengths = done["output_len"].to_numpy(dtype=np.int64)
    first_s = done["first_token_s"].to_numpy(dtype=float)
    finish_s = done["finish_s"].to_numpy(dtype=float)
    first, last = _step_of(ends, first_s), _step_of(ends, finish_s)
    broken = (np.isin(ids, np.fromiter(token_breaks, dtype=ids.dtype, count=len(token_breaks)))
              if token_breaks else np.zeros(len(ids), dtype=bool))
    if not np.array_equal(last[~broken] - first[~broken], lengths[~broken] - 1):
        raise RuntimeError("a request's tokens are not one per step")  # invariant
    spanning = np.zeros(len(ends), dtype=np.int64)
    np.add.at(spanning, first[~broken], 1)
    np.add.at(spanning, last[~broken], -1)
    counts = np.cumsum(spanning)[:-1]  # [steps - 1]: requests whose tokens straddle gap j
    broken_gaps = broken_token_gaps(ends, first[broken], finish_s[broken], lengths[broken],
                                    [token_breaks[int(i)] for i in ids[broken]])
    return (np.concatenate([gap_after[counts > 0], broken_gaps]),
            np.concatenate([counts[counts > 0], np.ones(len(broken_gaps), dtype=np.int64)]))


def _percentile_name(p: float) -> str:
    """vLLM's key: ``p99`` for 99, ``p99.9`` for 99.9."""
    return f"p{int(p)}" if int(p) == p else f"p{p}"


def _stats_ms(name: str, seconds: np.ndarray, percentiles: Iterable[float],
              counts: np.ndarray | None = None) -> dict:
    """mean, median, std and each percentile (numpy's linear interpolation, as vLLM) of
    ``seconds`` in milliseconds, under vLLM's keys; None when there are none. With
    ``counts``, value ``seconds[i]`` occurs ``counts[i]`` times (the same figures as for
    ``np.repeat(seconds, counts)``, to the 6 decimals kept: tests/test_serving_metrics.py)."""
    percentiles = list(percentiles)
    keys = [f"{_percentile_name(p)}_{name}_ms" for p in percentiles]
    if not len(seconds):
        return dict.fromkeys([f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms", *keys])
    values = np.asarray(seconds, dtype=float) * 1000.0
    if counts is None:
        at = np.percentile(values, [50, *percentiles])
        mean, std = float(values.mean()), float(values.std())
    else:
        at, mean, std = _weighted_stats(values, np.asarray(counts, dtype=np.int64), [50, *percentiles])
    out = {f"mean_{name}_ms": round(mean, 6),
           f"median_{name}_ms": round(float(at[0]), 6),
           f"std_{name}_ms": round(std, 6)}
    out.update((key, round(float(v), 6)) for key, v in zip(keys, at[1:]))
    return out


def _weighted_stats(values: np.ndarray, counts: np.ndarray,
                    percentiles: list[float]) -> tuple[list[float], float, float]:
    """Percentiles (numpy's linear method: rank q/100 * (n - 1), interpolated between the
    two order statistics around it), mean and std of ``values`` each repeated ``counts``."""
    order = _stable_argsort(values)
    values, counts = values[order], counts[order]
    n = int(counts.sum())
    ends = np.cumsum(counts)  # order statistics ends[i-1] .. ends[i] - 1 are values[i]

    def order_statistic(k: int) -> float:
        return float(values[np.searchsorted(ends, k, side="right")])

    at = []
    for q in percentiles:
        rank = q / 100.0 * (n - 1)
        lo = int(np.floor(rank))
        low, high = order_statistic(lo), order_statistic(min(lo + 1, n - 1))
        at.append(float(np.percentile([low, high], (rank - lo) * 100.0)))
    mean = float((values * counts).sum() / n)
    std = float(np.sqrt((counts * (values - mean) ** 2).sum() / n))
    return at, mean, std


def _stable_argsort(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` of finite ``values`` (ties in index order).

    NOTE: numpy's default argsort, then a sort of int64 keys (each value's rank among the
    distinct values, then its index), are vectorised sorts; the stable argsort (timsort)
    took 2.5x as long on the 800,000 token gaps of Azure conv's paged run. (A NaN would
    rank alone: the gaps of finite step times have none.)
    """
    order = np.argsort(values)  # ties in any order
    ordered = values[order]
    rank = np.zeros(len(values), dtype=np.int64)  # [n]: how many distinct values are smaller
    np.cumsum(ordered[1:] != ordered[:-1], out=rank[1:])
    keys = rank * len(values) + order
    keys.sort()
    return keys % len(values)


def request_latencies(requests: pd.DataFrame) -> dict[str, np.ndarray]:
    """TTFT, TPOT (0 for a one-token output, as vLLM counts it for goodput) and E2EL of
    every finished request, in seconds, in table order: each [finished] float64."""
    done = requests[requests["status"] == "finished"]
    arrival = done["arrival_s"].to_numpy(dtype=float)
    first = done["first_token_s"].to_numpy(dtype=float)
    finish = done["finish_s"].to_numpy(dtype=float)
    n = done["output_len"].to_numpy(dtype=float)
    ttft = first - arrival
    e2el = finish - arrival
    tpot = np.zeros(len(done))
    multi = n > 1
    tpot[multi] = (e2el[multi] - ttft[multi]) / (n[multi] - 1)
    return {"ttft": ttft, "tpot": tpot, "e2el": e2el, "multi_token": multi}


def good_requests(latencies: Mapping[str, np.ndarray], targets_ms: Mapping[str, float]) -> np.ndarray:
    """Which finished requests meet every target of ``targets_ms`` (ttft, tpot, e2el in
    milliseconds; vLLM: latency <= target): [finished] bool."""
    good = np.ones(len(latencies["ttft"]), dtype=bool)
    for name, target in targets_ms.items():
        good &= latencies[name] <= target / 1000.0
    return good


def serving_metrics(steps: pd.DataFrame, requests: pd.DataFrame, slo,
                    token_breaks: Mapping[int, list] | None = None) -> dict:
    """results.json's ``serving`` entry of one system: vLLM's serving benchmark figures
    under its names, and goodput and SLO attainment at ``slo`` (a ``SloSpec``)."""
    done = requests[requests["status"] == "finished"]
    latencies = request_latencies(requests)
    duration = float(done["finish_s"].max()) if len(done) else 0.0
    out_tokens = float((done["output_len"] * done["num_seqs"]).sum())
    in_tokens = float(done["prompt_len"].sum())

    def per_s(count: float) -> float | None:
        return round(count / duration, 6) if duration > 0 else None

    out: dict = {"completed": int(len(done)), "duration_s": round(duration, 6),
                 "request_throughput": per_s(len(done)),
                 "output_throughput": per_s(out_tokens),
                 "total_token_throughput": per_s(in_tokens + out_tokens)}
    percentiles = slo.percentiles
    out.update(_stats_ms("ttft", latencies["ttft"], percentiles))
    out.update(_stats_ms("tpot", latencies["tpot"][latencies["multi_token"]], percentiles))
    itl_gaps, itl_counts = inter_token_gap_counts(steps, requests, token_breaks)
    out.update(_stats_ms("itl", itl_gaps, percentiles, itl_counts))
    out.update(_stats_ms("e2el", latencies["e2el"], percentiles))
    targets = slo.targets_ms
    if targets:
        good = int(good_requests(latencies, targets).sum())
        total = len(requests)
        out.update({"good_completed": good, "request_goodput": per_s(good) if duration > 0 else 0.0,
                    "slo_attainment": round(good / total, 6) if total else None})
    else:
        out.update({"good_completed": None, "request_goodput": None, "slo_attainment": None})
    out["slo"] = {f"{name}_ms": value for name, value in targets.items()}
    return out
