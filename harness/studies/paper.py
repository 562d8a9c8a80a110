"""The PagedAttention paper's experiments (Kwon et al., SOSP 2023) as studies.

Each builder turns the composed config (plain dicts; ``study`` holds the
experiment's own parameters, ``study.workloads.<panel>`` the workloads composed
from ``conf/workload/``) into chains of jobs, and each ``derive`` turns the jobs'
summaries into the measured values that ``reports/paper_values.yaml`` lists
published values for (same ids) plus the series the figures draw.

The setup is fixed from the paper's text (``conf/experiment/vllm_setup.yaml``):
nothing here depends on the published outcomes.
"""

from __future__ import annotations

import copy
import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable

from harness.errors import ConfigError
from harness.studies.runner import Chain, Job, with_overrides

# The paper's system names, in its legend order, and how the report labels them.
PAPER_LABELS = {"orca_max": "Orca (Max)", "orca_pow2": "Orca (Pow2)",
                "orca_oracle": "Orca (Oracle)", "vllm": "vLLM"}


@dataclass
class Plan:
    """What a study runs and how its results become measured values."""

    chains: list[Chain]
    derive: Callable[[list[tuple[Job, dict]]], dict]
    describe: Callable[[Job, dict], str]


# ----------------------------------------------------------------------------- helpers

def _systems(study: dict) -> dict[str, str]:
    """Paper name -> catalog system name, in the paper's legend order."""
    systems = study.get("systems") or {}
    unknown = sorted(set(systems) - set(PAPER_LABELS))
    if unknown:
        raise ConfigError(f"study.systems.{unknown[0]}: unknown paper system; use "
                          f"{', '.join(PAPER_LABELS)}")
    return {name: systems[name] for name in PAPER_LABELS if name in systems}


def _workload(study: dict, panel: str) -> dict:
    workloads = study.get("workloads") or {}
    if panel not in workloads:
        raise ConfigError(f"study.workloads.{panel}: missing; compose it in the experiment's "
                          f"defaults, e.g. - /workload@study.workloads.{panel}: sharegpt_like")
    return copy.deepcopy(workloads[panel])


def _count(study: dict, n: float) -> int:
    """A request count scaled by ``study.scale`` (tests run shortened studies), at least min_requests."""
    scale = float(study.get("scale", 1.0))
    if not scale > 0:
        raise ConfigError(f"study.scale: must be > 0, got {scale}")
    wanted, minimum = int(round(n * scale)), int(study.get("min_requests", 20))
    if wanted < minimum:
        _say_raised(wanted, minimum)
    return max(minimum, wanted)


@functools.lru_cache(maxsize=None)
def _say_raised(wanted: int, minimum: int) -> None:
    """Say (once per pair) that a job runs more requests than the study's numbers give."""
    print(f"note: study: {wanted} requests raised to study.min_requests={minimum}", file=sys.stderr)


def _job(base: dict, key: str, system: str, workload: dict, overrides: dict, params: dict,
         probe_blocks: bool = False) -> Job:
    cfg = copy.deepcopy(base)
    cfg["workload"] = copy.deepcopy(workload)
    return Job(key, system, with_overrides(cfg, overrides), params, probe_blocks, dict(overrides))


def _norm_latency(summary: dict) -> float | None:
    return summary["latency"]["normalized_s_per_token"]["mean"]


def _saturated(threshold: float) -> Callable[[dict], bool]:
    """A run is past the system's capacity when its mean normalized latency exceeds
    ``threshold`` (or it could not finish its requests)."""
    def stop(summary: dict) -> bool:
        lat = _norm_latency(summary)
        return (not summary.get("complete", True) or lat is None or lat > threshold
                or summary["requests"]["unfinished"] > 0)
    return stop


def sustained_rate(points: list[tuple[float, float | None]], threshold: float) -> dict:
    """The highest rate whose normalized latency stays at or below ``threshold``.

    ``points``: (rate, latency) in ascending rate. The crossing is interpolated
    linearly between the last point below and the first point above; ``bounded``
    is False when no point crossed (the value is then the highest rate measured).
    """
    below = None
    for rate, lat in points:
        if lat is None or lat > threshold:
            if below is None:
                return {"rate": None, "bounded": True, "lo": None, "hi": rate}
            r0, l0 = below
            frac = (threshold - l0) / (lat - l0) if lat is not None and lat > l0 else 0.0
            return {"rate": r0 + frac * (rate - r0), "bounded": True, "lo": r0, "hi": rate}
        below = (rate, lat)
    return {"rate": below[0] if below else None, "bounded": False,
            "lo": below[0] if below else None, "hi": None}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _rate_chains(base: dict, study: dict, panels: list[str], systems: dict[str, str],
                 threshold: float) -> list[Chain]:
    chains = []
    for panel in panels:
        workload = _workload(study, panel)
        rates = (study.get("rates") or {}).get(panel)
        duration = (study.get("duration_s") or {}).get(panel)
        if not rates or not duration:
            raise ConfigError(f"study.rates.{panel} and study.duration_s.{panel} must be set")
        for paper_name, system in systems.items():
            jobs = [_job(base, f"{panel}/rate={r:g}", system, workload,
                         {"workload.arrival.process": "poisson", "workload.arrival.rate": float(r),
                          "workload.num_requests": _count(study, r * duration)},
                         {"panel": panel, "rate": float(r), "paper_system": paper_name})
                    for r in sorted(rates)]
            chains.append(Chain(jobs, stop=_saturated(threshold),
                                extra_after_stop=int(study.get("points_after_saturation", 1))))
    return chains


def _latency_text(job: Job, s: dict) -> str:
    lat = _norm_latency(s)
    return (f"norm. latency {lat:.3f} s/token, batch {s['study']['mean_batch_per_step']:.1f}"
            if lat is not None else "no request finished")


def _rate_series(pairs, panels, systems, threshold) -> tuple[dict, dict]:
    series: dict[str, dict[str, list]] = {}
    sustained: dict[str, dict[str, dict]] = {}
    for panel in panels:
        series[panel], sustained[panel] = {}, {}
        for paper_name in systems:
            points = sorted((j.params["rate"], _norm_latency(s)) for j, s in pairs
                            if j.params["panel"] == panel and j.params["paper_system"] == paper_name)
            series[panel][paper_name] = [[r, lat] for r, lat in points]
            sustained[panel][paper_name] = sustained_rate(points, threshold)
    return series, sustained


def _rate_sweep(base: dict, study: dict, compare: Callable[[str, dict], dict],
                describe: Callable[[Job, dict], str],
                extras: Callable[[list[tuple[Job, dict]]], dict] | None = None) -> Plan:
    """Normalized latency vs Poisson request rate, per panel and system; each chain stops
    once its system saturates.

    ``measured`` holds each system's sustained rate per panel plus what
    ``compare(panel, {system: sustained rate})`` derives; ``extras(pairs)`` adds
    study-specific entries to the result.
    """
    systems = _systems(study)
    panels = list((study.get("rates") or {}).keys())
    threshold = float(study["threshold_s_per_token"])
    chains = _rate_chains(base, study, panels, systems, threshold)

    def derive(pairs):
        series, sustained = _rate_series(pairs, panels, systems, threshold)
        measured = {}
        for panel in panels:
            rates = {name: sustained[panel][name]["rate"] for name in systems}
            for name, rate in rates.items():
                measured[f"{panel}.{name}.sustained_rps"] = rate
            measured.update(compare(panel, rates))
        return {"measured": measured, "series": series, "sustained": sustained,
                "threshold_s_per_token": threshold, **(extras(pairs) if extras else {})}

    return Plan(chains, derive, describe)


# ------------------------------------------------------------------------- Fig. 2

def fig2(base: dict, study: dict) -> Plan:
    """KV memory breakdown of the four systems on ShareGPT-like at a saturating rate."""
    systems = _systems(study)
    workload = _workload(study, "sharegpt")
    rate = float(study["rate"])
    overrides = {"workload.arrival.process": "poisson", "workload.arrival.rate": rate,
                 "workload.num_requests": _count(study, study["num_requests"])}
    chains = [Chain([_job(base, f"sharegpt/rate={rate:g}", system, workload, overrides,
                          {"panel": "sharegpt", "rate": rate, "paper_system": name})])
              for name, system in systems.items()]

    def derive(pairs):
        measured, details = {}, {}
        for job, s in pairs:
            name, m = job.params["paper_system"], s["memory"]
            # The paper's four categories. Its Orca (Oracle) bar has no internal
            # fragmentation although the buddy allocator rounds every reservation up,
            # so the paper counts buddy rounding under "external fragmentation &
            # others" and only the policy's over-reservation as "internal". For the
            # paged system the rounding is the unused tail of each last block: internal.
            paged = s["allocator"].get("kind") == "paged"
            rounding = m["internal_rounding_pct"]
            free = m["external_fragmentation_pct"] + m["idle_pct"]
            cats = {
                "token_states": m["token_states_pct"],
                "reservation": m["reserved_pct"],
                "internal_fragmentation": m["internal_over_reservation_pct"] + (rounding if paged else 0.0),
                "external_and_others": free + (0.0 if paged else rounding),
                "waste": 100.0 - m["token_states_pct"],
            }
            for cat, value in cats.items():
                measured[f"{name}.{cat}"] = value
            details[name] = {**{k: m[k] for k in (
                "token_states_pct", "reserved_pct", "internal_over_reservation_pct",
                "internal_rounding_pct", "external_fragmentation_pct", "idle_pct")},
                "waiting_time_share": s["study"]["waiting_time_share"],
                "mean_batch_per_step": s["study"]["mean_batch_per_step"]}
        return {"measured": measured, "details": details}

    def describe(job, s):
        m = s["memory"]
        return (f"token states {m['token_states_pct']:.1f}%, waiting "
                f"{100 * s['study']['waiting_time_share']:.0f}% of the time")

    return Plan(chains, derive, describe)


# ------------------------------------------------------------------------ Fig. 13

def fig13(base: dict, study: dict) -> Plan:
    """Mean batched requests per iteration at the paper's rates (and, as a supplement, saturated)."""
    systems = _systems(study)
    chains = []
    for panel, rate in (study.get("rates") or {}).items():
        workload = _workload(study, panel)
        n = _count(study, float(rate) * float(study["duration_s"][panel]))
        variants = {"paper_rate": {"workload.arrival.process": "poisson",
                                   "workload.arrival.rate": float(rate)}}
        if study.get("saturated", True):
            variants["saturated"] = {"workload.arrival.process": "offline"}
        for variant, arrival in variants.items():
            for name, system in systems.items():
                chains.append(Chain([_job(
                    base, f"{panel}/{variant}", system, workload,
                    {**arrival, "workload.num_requests": n},
                    {"panel": panel, "variant": variant, "rate": float(rate), "paper_system": name})]))

    def derive(pairs):
        measured, details = {}, {}
        for job, s in pairs:
            p = job.params
            # at the paper's rate: the mean over iterations; saturated: the mean over the
            # iterations during which a request waited (the drain at the end left out)
            suffix = "" if p["variant"] == "paper_rate" else ".saturated"
            measured[f"{p['panel']}{suffix}.{p['paper_system']}"] = (
                s["study"]["mean_batch_per_step"] if not suffix
                else s["study"]["mean_batch_while_waiting"])
            details[f"{p['panel']}{suffix}.{p['paper_system']}"] = {
                "mean_batch_per_step": s["study"]["mean_batch_per_step"],
                "mean_batch_time_weighted": s["batch"]["mean_seqs"],
                "mean_batch_while_waiting": s["study"]["mean_batch_while_waiting"],
                "waiting_time_share": s["study"]["waiting_time_share"],
                "normalized_latency_s_per_token": _norm_latency(s),
                "token_states_pct": s["memory"]["token_states_pct"]}
        return {"measured": measured, "details": details}

    def describe(job, s):
        return (f"mean batch {s['study']['mean_batch_per_step']:.2f} requests, waiting "
                f"{100 * s['study']['waiting_time_share']:.0f}% of the time")

    return Plan(chains, derive, describe)


# ------------------------------------------------------------------------ Fig. 12

def fig12(base: dict, study: dict) -> Plan:
    """Normalized latency vs request rate; the highest rate each system sustains."""

    def vllm_over_orca(panel: str, rates: dict) -> dict:
        return {f"{panel}.vllm_over_{other.removeprefix('orca_')}":
                _ratio(rates.get("vllm"), rates[other])
                for other in ("orca_oracle", "orca_pow2", "orca_max") if other in rates}

    return _rate_sweep(base, study, vllm_over_orca, _latency_text)


# ------------------------------------------------------------------------ Fig. 15

def fig15(base: dict, study: dict) -> Plan:
    """Memory saved by sharing: parallel sampling n and beam width k on Alpaca-like."""
    systems = _systems(study)
    if "vllm" not in systems:
        raise ConfigError("study.systems.vllm: fig15 measures the paged system's sharing; name it")
    rate = float(study["rate"])
    n = _count(study, study["num_requests"])
    chains = []
    for panel, key in (("parallel", "num_samples"), ("beam", "beam_width")):
        workload = _workload(study, panel)
        for width in study["widths"][panel]:
            chains.append(Chain([_job(
                base, f"{panel}/{key}={width}", systems["vllm"], workload,
                {"workload.arrival.process": "poisson", "workload.arrival.rate": rate,
                 "workload.num_requests": n, f"workload.{key}": int(width)},
                {"panel": panel, "width": int(width), "paper_system": "vllm"},
                probe_blocks=True)]))

    def derive(pairs):
        measured, details = {}, {}
        for job, s in pairs:
            p = job.params
            ident = f"{p['panel']}.{p['width']}"
            measured[ident] = s["study"].get("block_sharing_savings_pct")
            details[ident] = {"block_sharing_savings_pct": s["study"].get("block_sharing_savings_pct"),
                              "token_sharing_savings_pct": s["sharing_savings_pct"],
                              "preemptions": s["preemptions"],
                              "mean_batch_per_step": s["study"]["mean_batch_per_step"],
                              "normalized_latency_s_per_token": _norm_latency(s)}
        return {"measured": measured, "details": details}

    def describe(job, s):
        return (f"saving {s['study'].get('block_sharing_savings_pct', float('nan')):.1f}% of blocks "
                f"({s['sharing_savings_pct']:.1f}% of tokens), {s['preemptions']} preemptions")

    return Plan(chains, derive, describe)


# ----------------------------------------------------------------------- Fig. 18b

def fig18b(base: dict, study: dict) -> Plan:
    """Normalized latency of the paged system vs block size at fixed rates (and saturated)."""
    systems = _systems(study)
    if "vllm" not in systems:
        raise ConfigError("study.systems.vllm: fig18b sweeps the paged system's block size; name it")
    variants = {"paper_rate": None}
    if study.get("saturated", False):
        variants["saturated"] = {"workload.arrival.process": "offline"}
    chains = []
    for panel, rate in study["rates"].items():
        workload = _workload(study, panel)
        n = _count(study, float(rate) * float(study["duration_s"][panel]))
        for variant, arrival in variants.items():
            arrival = arrival or {"workload.arrival.process": "poisson",
                                  "workload.arrival.rate": float(rate)}
            for bs in study["block_sizes"]:
                chains.append(Chain([_job(
                    base, f"{panel}/{variant}/block={bs}", systems["vllm"], workload,
                    {**arrival, "workload.num_requests": n, "block_size": int(bs)},
                    {"panel": panel, "variant": variant, "block_size": int(bs), "rate": float(rate),
                     "paper_system": "vllm"})]))
    near_best = float(study.get("near_best_fraction", 0.10))

    def derive(pairs):
        measured, series, details = {}, {}, {}
        for panel in study["rates"]:
            for variant in variants:
                prefix = panel if variant == "paper_rate" else f"{panel}.{variant}"
                points = sorted(((j.params["block_size"], _norm_latency(s), s) for j, s in pairs
                                 if j.params["panel"] == panel and j.params["variant"] == variant),
                                key=lambda p: p[0])
                series[prefix] = [[bs, lat] for bs, lat, _ in points]
                valid = [lat for _, lat, _ in points if lat is not None]
                best = min(valid) if valid else None
                measured[f"{prefix}.best_block_sizes"] = [
                    bs for bs, lat, _ in points
                    if lat is not None and best is not None and lat <= best * (1 + near_best)]
                for bs, lat, s in points:
                    measured[f"{prefix}.block_{bs}"] = lat
                    details[f"{prefix}.block_{bs}"] = {
                        "normalized_latency_s_per_token": lat,
                        "mean_batch_per_step": s["study"]["mean_batch_per_step"],
                        "mean_batch_while_waiting": s["study"]["mean_batch_while_waiting"],
                        "token_states_pct": s["memory"]["token_states_pct"],
                        "internal_fragmentation_pct": s["memory"]["internal_fragmentation_pct"],
                        "preemptions": s["preemptions"],
                        "waiting_time_share": s["study"]["waiting_time_share"],
                        "requests_per_s": s["throughput"]["requests_per_s"]}
        return {"measured": measured, "series": series, "details": details,
                "near_best_fraction": near_best}

    return Plan(chains, derive, _latency_text)


# ------------------------------------------------------------------ shared prefix

def shared_prefix(base: dict, study: dict) -> Plan:
    """One-shot and five-shot shared prefixes: sustained rate of vLLM vs Orca (Oracle)."""

    def vllm_over_oracle(panel: str, rates: dict) -> dict:
        return {f"{panel}.vllm_over_oracle": _ratio(rates.get("vllm"), rates.get("orca_oracle"))}

    def prefix_hit_rate(pairs) -> dict:
        return {"prefix_hit_rate": {f"{j.params['panel']}/{j.params['rate']:g}":
                                    s["prefix_cache"]["hit_rate"]
                                    for j, s in pairs if j.params["paper_system"] == "vllm"}}

    def describe(job, s):
        hit_rate = s["prefix_cache"]["hit_rate"]  # None: no prompt was admitted
        return _latency_text(job, s) + (f", prefix hits {100 * hit_rate:.0f}%" if hit_rate is not None else "")

    return _rate_sweep(base, study, vllm_over_oracle, describe, prefix_hit_rate)


STUDIES: dict[str, Callable[[dict, dict], Plan]] = {
    "vllm_fig2": fig2, "vllm_fig13": fig13, "vllm_fig12": fig12, "vllm_fig15": fig15,
    "vllm_fig18b": fig18b, "shared_prefix": shared_prefix,
}

# The keys each study reads from its ``study`` node (beyond COMMON_KEYS); others are typos.
COMMON_KEYS = {"name", "figure", "workers", "scale", "min_requests", "systems", "workloads"}
STUDY_KEYS: dict[str, set[str]] = {
    "vllm_fig2": {"rate", "num_requests"},
    "vllm_fig13": {"rates", "duration_s", "saturated"},
    "vllm_fig12": {"rates", "duration_s", "threshold_s_per_token", "points_after_saturation"},
    "vllm_fig15": {"widths", "rate", "num_requests"},
    "vllm_fig18b": {"block_sizes", "rates", "duration_s", "near_best_fraction", "saturated"},
    "shared_prefix": {"rates", "duration_s", "threshold_s_per_token", "points_after_saturation"},
}


# The shape of each study value: a positive number or count, true/false, a list of them,
# or a mapping of panels to either.
_POSITIVE = {"scale", "rate", "threshold_s_per_token", "near_best_fraction"}
_COUNTS = {"min_requests", "num_requests"}
_NON_NEGATIVE = {"points_after_saturation"}
_FLAGS = {"saturated"}
_LISTS = {"widths", "block_sizes"}
_PANELS = {"rates", "duration_s"}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _check_value(where: str, value: Any, count: bool = False) -> None:
    ok = _is_number(value) and (not count or float(value).is_integer())
    if not ok:
        what = "a positive integer" if count else "a positive number"
        raise ConfigError(f"{where}: must be {what}, got {value!r}")


def check_study_keys(study: dict) -> None:
    """Reject keys the named study does not read (naming the ones it does) and values of
    the wrong kind, before any job runs."""
    allowed = COMMON_KEYS | STUDY_KEYS.get(study.get("name"), set())
    unknown = sorted(set(study) - allowed)
    if unknown:
        raise ConfigError(f"study.{unknown[0]}: unknown key for study {study.get('name')!r}; "
                          f"valid keys: {', '.join(sorted(allowed))}")
    for key, value in study.items():
        where = f"study.{key}"
        if key in _POSITIVE or key in _COUNTS:
            _check_value(where, value, count=key in _COUNTS)
        elif key in _NON_NEGATIVE and value != 0:
            _check_value(where, value, count=True)
        elif key in _FLAGS and not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {value!r}")
        elif key in _LISTS:  # a list, or one per panel
            lists = value.items() if isinstance(value, dict) else [("", value)]
            for panel, items in lists:
                at = f"{where}.{panel}" if panel else where
                if not isinstance(items, list) or not items:
                    raise ConfigError(f"{at}: must be a non-empty list, got {items!r}")
                for i, item in enumerate(items):
                    _check_value(f"{at}[{i}]", item, count=True)
        elif key in _PANELS:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: must map each panel to its values, got {value!r}")
            for panel, item in value.items():
                for i, number in enumerate(item if isinstance(item, list) else [item]):
                    _check_value(f"{where}.{panel}" + (f"[{i}]" if isinstance(item, list) else ""),
                                 number)
