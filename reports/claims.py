"""The "Theory and claims" table: the article's claims (``claims.yaml``) vs. what a run measured.

A claim's checks name measurements from ``MEASURES``. A measurement returns one
``Measured`` per subject (a system of the run, or a worked example the harness
computes with its own allocators), or a reason why it could not measure. The
verdict is then one of ``holds``, ``does not hold``, ``not measured in this run``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from pagebench.reports.metrics import waste_pct
from pagebench.reports.rundata import RunData

CLAIMS_FILE = Path(__file__).with_name("claims.yaml")
HOLDS, FAILS, NOT_MEASURED = "holds", "does not hold", "not measured in this run"
# The kinds of expectation a check may give (exactly one; claims.yaml's header says what each means).
EXPECTATIONS = ("approx", "below", "at_least", "range")


@dataclass(frozen=True)
class Measured:
    subject: str  # "paged", "worked example", ...
    value: float
    how: str  # one sentence: what was divided by what
    predicted: float | None = None  # the theory's value for this run (for approx: predicted)


@dataclass(frozen=True)
class Row:
    claim_id: str
    claim: str
    article_value: str
    subject: str
    measured: float | None
    unit: str
    expected: str
    verdict: str
    how: str
    conditions: str = ""


class NotMeasured(Exception):
    """Raised by a measurement that the run gives no data for; the message says why."""


# --------------------------------------------------------------------------- measurements
def worked_example_max_reservation(run: RunData, length: int, max_len: int) -> list[Measured]:
    from pagebench.allocators.contiguous import ContiguousKVCacheManager

    manager = ContiguousKVCacheManager(max_len, policy="max", max_model_len=max_len, arena="buddy")
    manager.admit(0, list(range(length)), final_len=length, num_tokens=length)
    b = manager.breakdown(memory_blocked=False)
    reservation = b.token_states + b.reserved + b.internal_over_reservation
    return [Measured("worked example (contiguous max manager)",
                     100.0 * b.internal_over_reservation / reservation,
                     f"one {length}-token sequence, max length {max_len}: over-reserved slots / "
                     "reserved slots, from the manager's breakdown")]


def worked_example_paged_utilization(run: RunData, length: int, block_size: int) -> list[Measured]:
    from pagebench.allocators.paged import PagedKVCacheManager

    manager = PagedKVCacheManager(length // block_size + 2, block_size, enable_prefix_caching=False)
    manager.admit(0, list(range(length)), final_len=length, num_tokens=length)
    b = manager.breakdown(memory_blocked=False)
    return [Measured("worked example (paged manager)", 100.0 * b.token_states / b.allocated_slots,
                     f"one {length}-token sequence in {block_size}-token blocks: token-state slots"
                     " / allocated slots, from the manager's breakdown")]


def _systems_of(run: RunData, kind: str, policy: str | None = None) -> dict[str, dict]:
    """The run's systems of this kind (and policy) that ran: one that rejected every
    request measured nothing."""
    out = {}
    for name, s in run.systems.items():
        alloc = s.get("allocator", {})
        if alloc.get("kind") == kind and (policy is None or alloc.get("policy") == policy) \
                and s.get("steps", 1):
            out[name] = s
    if not out:
        what = f"contiguous {policy}" if policy else kind
        raise NotMeasured(f"no {what} system served a request in this run")
    return out


def max_reservation_waste(run: RunData) -> list[Measured]:
    out = []
    max_len = (run.results or {}).get("model", {}).get("max_model_len")
    for name, s in _systems_of(run, "contiguous", "max").items():
        slots = s["memory"]["mean_slots"]
        reserved = slots["token_states"] + slots["reserved"] + slots["internal_over_reservation"]
        if reserved <= 0:
            continue
        measured = 100.0 * slots["internal_over_reservation"] / reserved
        predicted = None
        requests = run.requests.get(name)
        if requests is not None and max_len:
            done = requests[requests["status"] == "finished"]
            if len(done):
                step = (s.get("simulated_time_s") or 0.0) / max(1, s.get("steps") or 1)
                weight = (done["finish_s"] - done["first_token_s"] + step).to_numpy(float)
                weight = weight * done["num_seqs"].to_numpy(float)
                final_len = (done["prompt_len"] + done["output_len"] - 1).to_numpy(float)
                predicted = 100.0 * (1.0 - float((weight * final_len).sum())
                                     / (max_len * float(weight.sum())))
        out.append(Measured(name, measured,
                            "time-averaged over-reserved / reserved slots; predicted = 1 - L/L_max "
                            f"averaged over requests (L_max = {max_len}) weighted by residence time",
                            predicted))
    if not out:
        raise NotMeasured("the contiguous max system reserved nothing")
    return out


def _has_forks(run: RunData) -> bool:
    """Whether the run's requests fork (parallel samples or beams share blocks)."""
    workload = (run.results or {}).get("workload", {})
    return max(workload.get("max_num_samples", 1) or 1, workload.get("max_beam_width", 1) or 1) > 1


def paged_unfilled_per_sequence(run: RunData) -> list[Measured]:
    if _has_forks(run):
        # NOTE: forked sequences share their partial last blocks: the empty slots are physical
        # and the sequences logical, so the ratio does not say what a block costs per sequence
        raise NotMeasured("sequences share partial blocks (parallel samples or beams): the "
                          "theory is per unshared sequence")
    out = []
    for name, s in _systems_of(run, "paged").items():
        block_size = s["allocator"].get("block_size") or (run.results or {}).get("block_size")
        mean_seqs = (s.get("batch") or {}).get("mean_seqs") or 0.0
        slots = s["memory"].get("mean_slots")
        if mean_seqs <= 0 or not block_size or not slots:
            continue
        unfilled = (slots["reserved"] + slots["internal_rounding"]) / mean_seqs
        out.append(Measured(name, unfilled,
                            f"time-averaged empty slots of allocated blocks / running sequences; "
                            f"predicted (block_size - 1) / 2 at block_size {block_size}",
                            (block_size - 1) / 2))
    if not out:
        raise NotMeasured("no paged system ran any sequence")
    return out


def _waste(run: RunData, systems: dict[str, dict]) -> list[Measured]:
    out = []
    for name, s in systems.items():
        value = waste_pct(s)
        if value is not None:
            out.append(Measured(name, value, "1 - token states / memory in use (pool minus idle), "
                                             "time-averaged"))
    if not out:
        raise NotMeasured("no memory was in use")
    return out


def paged_waste_pct(run: RunData) -> list[Measured]:
    return _waste(run, _systems_of(run, "paged"))


def contiguous_waste_pct(run: RunData) -> list[Measured]:
    return _waste(run, _systems_of(run, "contiguous"))


def sharing_savings_pct(run: RunData) -> list[Measured]:
    forks = _has_forks(run)
    out = []
    for name, s in _systems_of(run, "paged").items():
        prefix = bool(s["allocator"].get("prefix_caching"))
        cache = s.get("prefix_cache") or {}
        hit_rate = cache.get("hit_rate") or 0.0
        # NOTE: a request re-admitted after a preemption hits its own freed blocks: no sharing
        shared_hits = (cache.get("hit_tokens") or 0) - (cache.get("readmission_hit_tokens") or 0)
        if not forks and not (prefix and shared_hits > 0):
            continue  # nothing was shared: the claim does not apply to this system
        out.append(Measured(name, s["memory"]["sharing_savings_pct"],
                            "1 - physical token slots / logical token slots (a shared slot counted "
                            f"once per sharer), time-averaged; prefix-cache hit rate "
                            f"{100 * hit_rate:.1f}%"))
    if not out:
        raise NotMeasured("nothing was shared (no prefix-cache hits, no parallel samples or beams)")
    return out


_INDIRECTION_KEY = re.compile(r"indirection.*(share|fraction|pct|percent|overhead)|"
                              r"(share|fraction).*indirection", re.IGNORECASE)


def _find_numbers(node: Any, pattern: re.Pattern, path: str = "") -> list[tuple[str, float]]:
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            sub = f"{path}.{key}" if path else str(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and pattern.search(str(key)) and math.isfinite(value):
                found.append((sub, float(value)))
            else:
                found.extend(_find_numbers(value, pattern, sub))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_find_numbers(value, pattern, f"{path}[{i}]"))
    return found


def indirection_share_of_decode(run: RunData) -> list[Measured]:
    kernel = run.kernel_results or {}
    if kernel.get("timings") == "cpu":  # the claim is about the GPU kernel
        raise NotMeasured("the kernel benchmark ran on a CPU, where it times torch's reference "
                          "paths, not the Triton kernels: run it on a GPU")
    rows = [r for r in kernel.get("rows") or [] if isinstance(r, dict)
            and isinstance(r.get("indirection_share"), (int, float)) and r.get("block_size")]
    if rows:
        # The claim is about a serving block size: the benchmarked size nearest 16.
        block = min({r["block_size"] for r in rows}, key=lambda b: (abs(b - 16), b))
        out = []
        for head in dict.fromkeys(r.get("head_config", "?") for r in rows):
            mine = [r for r in rows if r.get("head_config", "?") == head and r["block_size"] == block]
            if mine:
                worst = max(mine, key=lambda r: r["indirection_share"])
                out.append(Measured(
                    f"kernel benchmark: {head}, block {block}", 100.0 * worst["indirection_share"],
                    f"kernel_results.json (GPU timings): layers x (paged - contiguous attention) / "
                    f"decode step, largest over {len(mine)} batch x context points (worst at batch "
                    f"{worst.get('batch')}, context {worst.get('context_len')})"))
        return out
    sources = []
    if run.kernel_results is not None:
        sources.append(("kernel_results.json", run.kernel_results))
    if run.results is not None:
        sources.append(("results.json", run.results))
    for filename, data in sources:
        hits = _find_numbers(data, _INDIRECTION_KEY)
        if hits:
            # The largest share is the conservative reading of the claim.
            key, value = max(hits, key=lambda kv: kv[1] * (100.0 if _is_fraction(kv[0]) else 1.0))
            pct = value * 100.0 if _is_fraction(key) else value
            return [Measured("kernel benchmark", pct,
                             f"{filename}: {key} (largest over the benchmarked shapes)")]
    raise NotMeasured("no kernel benchmark results (kernel_results.json) in this run")


def _is_fraction(key: str) -> bool:
    return "fraction" in key.lower() or key.lower().endswith("share")


MEASURES: dict[str, Callable[..., list[Measured]]] = {
    f.__name__: f for f in (worked_example_max_reservation, worked_example_paged_utilization,
                            max_reservation_waste, paged_unfilled_per_sequence, paged_waste_pct,
                            contiguous_waste_pct, sharing_savings_pct, indirection_share_of_decode)
}


# --------------------------------------------------------------------------- evaluation
def load_claims(path: Path = CLAIMS_FILE) -> dict:
    """The claims file, checked: every check names a known measurement and a valid expectation."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        raise ValueError(f"{path}: expected a mapping with a 'claims' list")
    for i, claim in enumerate(data["claims"]):
        where = f"{path}: claims[{i}]"
        for key in ("id", "claim", "article_value", "checks"):
            if key not in claim:
                raise ValueError(f"{where}: missing {key!r}")
        for j, check in enumerate(claim["checks"]):
            if check.get("measure") not in MEASURES:
                raise ValueError(f"{where}.checks[{j}].measure: unknown {check.get('measure')!r}; "
                                 f"known: {', '.join(MEASURES)}")
            expect = check.get("expect") or {}
            if sum(k in expect for k in EXPECTATIONS) != 1:
                raise ValueError(f"{where}.checks[{j}].expect: give exactly one of "
                                 f"{', '.join(EXPECTATIONS)}")
    return data


def _judge(expect: dict, m: Measured) -> tuple[str, str]:
    """(expected text, verdict) of one measurement."""
    if "below" in expect:
        return f"< {expect['below']:g}", HOLDS if m.value < expect["below"] else FAILS
    if "at_least" in expect:
        return f"≥ {expect['at_least']:g}", HOLDS if m.value >= expect["at_least"] else FAILS
    if "range" in expect:
        low, high = expect["range"]
        return f"{low:g} – {high:g}", HOLDS if low <= m.value <= high else FAILS
    target = expect["approx"]
    if target == "predicted":
        if m.predicted is None:
            return "predicted (no request table)", NOT_MEASURED
        target = m.predicted
    tolerance = max(float(expect.get("tolerance", 0.0)),
                    float(expect.get("tolerance_rel", 0.0)) * abs(target))
    verdict = HOLDS if abs(m.value - target) <= tolerance + 1e-9 else FAILS
    return f"{target:.4g} ± {tolerance:.3g}", verdict


def _check_workload(run: RunData, workloads: list[str] | None) -> None:
    """``NotMeasured`` when the claim names the workloads it applies to and the run's is
    another (its figure would be compared with a setting the article did not measure)."""
    workload = (run.results or {}).get("workload") or {}
    kind = workload.get("kind") or workload.get("name")
    if workloads and kind not in workloads:
        raise NotMeasured(f"not comparable: the article measured it on {', '.join(workloads)}-"
                          f"style requests (long outputs, unknown ahead); this run's workload is "
                          f"{kind} (compare with workload={workloads[0]})")


def evaluate_claims(run: RunData, path: Path = CLAIMS_FILE) -> list[Row]:
    """One row per (claim, check, subject); a check with no data gives one 'not measured' row."""
    rows = []
    for claim in load_claims(path)["claims"]:
        text = " ".join(str(claim["claim"]).split())
        conditions = " ".join(str(claim.get("conditions") or "").split())
        for check in claim["checks"]:
            unit = check.get("unit", "")
            try:
                measured = MEASURES[check["measure"]](run, **(check.get("params") or {}))
                _check_workload(run, claim.get("workloads"))
            except NotMeasured as why:
                rows.append(Row(claim["id"], text, str(claim["article_value"]), "–", None, unit,
                                "–", NOT_MEASURED, str(why), conditions))
                continue
            for m in measured:
                expected, verdict = _judge(check["expect"], m)
                value = m.value if np.isfinite(m.value) else None
                rows.append(Row(claim["id"], text, str(claim["article_value"]), m.subject, value,
                                unit, expected, verdict if value is not None else NOT_MEASURED,
                                m.how, conditions))
    return rows
