"""``build_workload``: config node -> validated, sorted, summarised ``Workload``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from harness.errors import ConfigError
from harness.workloads.arrivals import CLOCK_RESOLUTION_S, MAX_ARRIVAL_S
from harness.workloads.registry import BuildContext, Draft, Tally, clip_drafts, lookup
from harness.workloads.request import Request
from harness.workloads.spec import parse_spec, to_plain
from harness.workloads.tokens import TokenSpace, readonly


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival time (request_id 0..N-1 in that order) and a JSON-safe summary."""

    name: str
    requests: tuple[Request, ...]
    summary: dict


def build_workload(cfg: Mapping[str, Any], *, seed: int, max_model_len: int) -> Workload:
    """Build the workload described by the ``workload`` config node.

    ``cfg`` is an OmegaConf DictConfig or a plain mapping with a ``kind`` key
    (see ``harness.workloads.KINDS``). Raises ``ConfigError`` for a bad config and
    ``InputError`` for a malformed trace row. The same ``seed`` gives the same
    workload, token ids included.
    """
    if not isinstance(max_model_len, (int, np.integer)) or max_model_len < 2:
        raise ConfigError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
    ctx = BuildContext(seed=int(seed), max_model_len=int(max_model_len), tokens=TokenSpace(int(seed)))
    spec, drafts = build_drafts(cfg, ctx)
    return finalize(spec.name or spec.kind, spec.kind, drafts, ctx.tally, spec.arrival.process)


def parse_workload(cfg: Any, where: str = "workload"):
    """The workload config node's kind and its checked spec, (kind, spec): what
    ``build_workload`` reads before it generates or loads any request."""
    data = to_plain(cfg)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a workload mapping with a 'kind' key, got {data!r}")
    kind = lookup(data.get("kind"), where)
    return kind, parse_spec(kind.spec, data, where)


def build_drafts(cfg: Any, ctx: BuildContext):
    """Parse ``cfg`` and run its kind's builder, clipping the result: (spec, drafts)."""
    kind, spec = parse_workload(cfg, ctx.where)
    drafts = kind.build(spec, ctx)
    drafts = clip_drafts(drafts, ctx.max_model_len, spec.clip, ctx.tally)
    if spec.num_samples > 1 or spec.beam_width > 1:
        for draft in drafts:
            draft.num_samples, draft.beam_width = spec.num_samples, spec.beam_width
    return spec, drafts


def finalize(name: str, kind: str, drafts: list[Draft], tally: Tally, process: str) -> Workload:
    if not drafts:
        raise ConfigError(
            f"workload {name!r} produced no requests ({tally.as_dict()}); widen the time window or "
            "filters, raise max_model_len (a longer-context model), or use workload.clip=truncate")
    bad = next((d for d in drafts if not d.arrival_time <= MAX_ARRIVAL_S), None)  # (nan, inf)
    if bad is not None:
        raise ConfigError(
            f"workload {name!r}: a request arrives at t={bad.arrival_time:g} s: the arrival "
            "settings (workload.arrival: rate, time_scale or target_rate) stretch time beyond "
            f"what the clock resolves (at most {MAX_ARRIVAL_S:.3g} s, to {CLOCK_RESOLUTION_S:g} "
            "s); use a larger rate or a smaller time_scale")
    order = sorted(range(len(drafts)), key=lambda i: drafts[i].arrival_time)  # stable
    requests = []
    for request_id, i in enumerate(order):
        d = drafts[i]
        prompt = d.prompt if d.prompt.dtype == np.int32 else d.prompt.astype(np.int32)
        if prompt.flags.writeable:
            prompt = readonly(prompt)
        outputs = d.output_token_ids
        if outputs is not None and outputs.flags.writeable:
            outputs = readonly(outputs)
        requests.append(Request(request_id=request_id, arrival_time=float(d.arrival_time),
                                prompt_token_ids=prompt, output_len=int(d.output_len),
                                num_samples=d.num_samples, beam_width=d.beam_width, name=d.name,
                                output_token_ids=outputs))
    summary = summarize(name, kind, requests, tally, process, [drafts[i].component for i in order])
    return Workload(name=name, requests=tuple(requests), summary=summary)


def _stats(values: np.ndarray) -> dict:
    return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
            "p99": float(np.percentile(values, 99)), "max": int(values.max())}


def summarize(name: str, kind: str, requests: list[Request], tally: Tally, process: str,
              components: list[str]) -> dict:
    """The JSON-safe summary written into results.json."""
    prompt = np.fromiter((r.prompt_len for r in requests), dtype=np.int64, count=len(requests))
    output = np.fromiter((r.output_len for r in requests), dtype=np.int64, count=len(requests))
    arrivals = np.fromiter((r.arrival_time for r in requests), dtype=np.float64, count=len(requests))
    samples = np.fromiter((max(r.num_samples, r.beam_width) for r in requests), dtype=np.int64,
                          count=len(requests))
    span = float(arrivals[-1] - arrivals[0])
    summary = {
        "name": name,
        "kind": kind,
        "num_requests": len(requests),
        "prompt_len": _stats(prompt),
        "output_len": _stats(output),
        "total_prompt_tokens": int(prompt.sum()),
        "total_output_tokens": int((output * samples).sum()),
        "total_tokens": int(prompt.sum() + (output * samples).sum()),
        "arrival_process": process,
        "arrival_span_s": span,
        "mean_rate_rps": (len(requests) - 1) / span if span > 0 else None,
        "max_num_samples": int(max(r.num_samples for r in requests)),
        "max_beam_width": int(max(r.beam_width for r in requests)),
        "rows": tally.as_dict(),
    }
    if any(components):
        counts: dict[str, int] = {}
        for c in components:
            counts[c] = counts.get(c, 0) + 1
        summary["components"] = counts
    return summary
