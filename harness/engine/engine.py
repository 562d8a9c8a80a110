"""The engine loop: arrivals -> schedule -> execute -> postprocess -> record."""

from __future__ import annotations

import gc
import hashlib
import time
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Callable, Protocol

import numpy as np

from harness.config.specs import EngineSpec
from harness.engine.fast_forward import Arrivals, fast_forward, plan_allows_fast_forward
from harness.engine.plan import StepPlan
from harness.engine.scheduler import Scheduler
from harness.engine.sequence import SequenceGroup
from harness.errors import PagebenchError
from harness.metrics.summaries import RunRecorder
from harness.workloads.request import Request


GC_YOUNG_THRESHOLD = 20_000  # net new objects between young collections during a run


class Executor(Protocol):
    name: str

    def execute(self, plan: StepPlan) -> tuple[float, dict[int, int] | None]:
        """Run the step; return its duration in seconds and the sampled tokens (or None)."""


class EngineStalled(PagebenchError):
    """Work remains but no step can run: a configuration that can never make progress."""


@dataclass
class EngineRun:
    """What one system's run produced."""

    recorder: RunRecorder
    scheduler: Scheduler
    wall_time_s: float
    complete: bool = True
    stop_reason: str | None = None
    rejected: dict[str, int] = field(default_factory=dict)
    output_digest: str = ""  # sha256 over every request's generated tokens, in request order
    executor_report: dict | None = None  # torch executor: timings, CPU-side costs, NVML summary
    telemetry_rows: list[dict] = field(default_factory=list)  # torch on CUDA: NVML samples
    fit_range: dict | None = None  # sim on a calibrated profile: the steps beyond its range
    cost_model: dict | None = None  # sim: the cost model and profiles that priced the steps
    offload: dict | None = None  # engine.offload on: the tiers' figures (harness.metrics.offload)
    replica_managers: list | None = None  # engine.replicas > 1: each replica's KV manager


def rejection_reason(request: Request, scheduler: Scheduler, spec: EngineSpec,
                     max_model_len: int) -> str | None:
    """Why a request can never run on this system, or None if it can."""
    manager = scheduler.manager
    width = max(request.num_samples, request.beam_width)
    if request.kv_len > max_model_len:
        return "longer_than_max_model_len"
    if not manager.fits_empty_pool(request.prompt_len, request.kv_len):
        return "larger_than_pool"
    if width * manager.member_slots(request.prompt_len, request.kv_len) > manager.capacity_slots:
        return "group_larger_than_pool"
    if width * 1 > spec.max_num_seqs:
        return "more_sequences_than_max_num_seqs"
    needs_whole_prefill = width > 1 or not spec.chunked_prefill
    if needs_whole_prefill and request.kv_len > spec.max_num_batched_tokens:
        return "prompt_exceeds_max_num_batched_tokens"
    return None


def run_engine(requests: tuple[Request, ...], scheduler: Scheduler, executor: Executor,
               spec: EngineSpec, *, max_model_len: int,
               on_progress: Callable[[int, float], None] | None = None,
               stop_requested: Callable[[], str | None] | None = None) -> EngineRun:
    """Drive ``requests`` through ``scheduler`` and ``executor`` until all finish.

    Time advances by step durations; when nothing runs it jumps to the next
    arrival. Requests that can never fit are rejected at arrival and counted.
    ``stop_requested`` (checked after each step) returns a reason to stop early,
    e.g. "interrupted" on Ctrl-C; the run then ends incomplete with what it has.

    NOTE: the objects that exist before the run (the workload's requests, loaded
    libraries) are frozen out of the garbage collector's generations meanwhile: the
    loop allocates many short-lived objects, and each full collection would otherwise
    walk all of them again (some 5% of a run's time). Skipped when someone else
    froze objects already (``gc.unfreeze`` would thaw theirs too). The youngest
    generation is collected every ``GC_YOUNG_THRESHOLD`` net new objects instead of 700
    meanwhile (restored after): the loop keeps what it records, so Python's default ran
    about 200 young collections per system on the Azure conv replay, 0.08-0.10 CPU s,
    against 6-7 and 0.03-0.04 s at 20,000 (``gc.callbacks``, 2026-12-04).
    """
    freeze = gc.isenabled() and gc.get_freeze_count() == 0
    thresholds = gc.get_threshold()
    if freeze:
        gc.freeze()
        gc.set_threshold(max(thresholds[0], GC_YOUNG_THRESHOLD), *thresholds[1:])
    try:
        return _run_engine(requests, scheduler, executor, spec, max_model_len=max_model_len,
                           on_progress=on_progress, stop_requested=stop_requested)
    finally:
        if freeze:
            gc.set_threshold(*thresholds)
            gc.unfreeze()


def _run_engine(requests: tuple[Request, ...], scheduler: Scheduler, executor: Executor,
                spec: EngineSpec, *, max_model_len: int,
                on_progress: Callable[[int, float], None] | None,
                stop_requested: Callable[[], str | None] | None) -> EngineRun:
    recorder = RunRecorder(scheduler.manager.capacity_slots)
    groups: dict[int, SequenceGroup] = {}
    token_digests: dict[int, bytes] = {}
    rejected: dict[str, int] = {}
    now = 0.0
    next_arrival = 0
    num_requests = len(requests)
    finished_count = 0
    wall_start = time.perf_counter()
    deadline = wall_start + spec.wall_time_limit_s if spec.wall_time_limit_s else None
    complete, stop_reason = True, None
    last_progress = wall_start
    bulk = spec.fast_forward and hasattr(executor, "decode_durations")
    # NOTE: a request's rejection depends only on the system's fixed sizes: decided up front
    reasons = [rejection_reason(r, scheduler, spec, max_model_len) for r in requests]
    arrivals = Arrivals.of(requests, reasons) if bulk else None

    while True:
        while next_arrival < num_requests and requests[next_arrival].arrival_time <= now:
            request = requests[next_arrival]
            reason = reasons[next_arrival]
            next_arrival += 1
            if reason is not None:
                rejected[reason] = rejected.get(reason, 0) + 1
                recorder.record_request(_request_row(request, None, "rejected"))
                finished_count += 1
                continue
            group = SequenceGroup(request)
            groups[request.request_id] = group
            scheduler.add(group)
        if not scheduler.has_work():
            if next_arrival >= num_requests:
                break
            now = max(now, requests[next_arrival].arrival_time)
            continue
        scheduler.step_start = now
        plan = scheduler.schedule()
        if plan.is_empty:
            if next_arrival < num_requests and not scheduler.running:
                now = max(now, requests[next_arrival].arrival_time)
                continue
            cause = ("the waiting request does not fit the free KV memory" if plan.memory_blocked
                     else "the waiting request exceeds the token or sequence budget")
            raise EngineStalled(
                f"no step can run at t={now:.3f}s with {len(scheduler.waiting)} waiting, "
                f"{len(scheduler.running)} running and {len(scheduler.swapped)} swapped requests: "
                f"{cause}. Raise engine.kv_capacity_slots (or use larger hardware), "
                "engine.max_num_batched_tokens or engine.max_num_seqs, or enable "
                "engine.chunked_prefill"
            )
        duration, sampled = executor.execute(plan)
        start = now
        now += duration
        # The memory the step ran with: its KV appended, before the requests it finishes are
        # freed (their KV was in use during it; the waiting head was refused before it).
        memory = scheduler.manager.breakdown(plan.memory_blocked)
        finished = scheduler.postprocess(plan, now, sampled)
        for group in finished:
            _record_finished(group, recorder, token_digests, groups)
        finished_count += len(finished)
        recorder.record_step(start, duration, plan.num_seqs,
                             plan.num_batched_tokens, plan.num_prefill_tokens,
                             len(scheduler.waiting), plan.num_preempted, memory)
        if bulk and plan_allows_fast_forward(plan, scheduler):
            arrivals.next = next_arrival
            freed = bool(finished)
            while True:  # steady decode spans; several in a row while requests finish
                advanced = fast_forward(scheduler, executor, recorder, freed, now, arrivals)
                if advanced is None:
                    break
                now = advanced.now
                for group in advanced.finished:
                    _record_finished(group, recorder, token_digests, groups)
                finished_count += len(advanced.finished)
                if not advanced.may_continue:
                    break
                freed = True
        if stop_requested is not None:
            reason = stop_requested()
            if reason:
                complete, stop_reason = False, reason
                break
        if on_progress is not None or deadline is not None:
            wall_now = time.perf_counter()
            if on_progress is not None and wall_now - last_progress > 0.5:
                on_progress(finished_count, now)
                last_progress = wall_now
            if deadline is not None and wall_now > deadline:
                complete, stop_reason = False, f"wall_time_limit_s={spec.wall_time_limit_s} reached"
                break

    for group in groups.values():
        recorder.record_request(_request_row(group.request, group, "unfinished"))
    if on_progress is not None:
        on_progress(finished_count, now)
    digest = hashlib.sha256()
    for request_id in sorted(token_digests):
        digest.update(token_digests[request_id])
    return EngineRun(recorder, scheduler, time.perf_counter() - wall_start, complete,
                     stop_reason, rejected, digest.hexdigest())


def _record_finished(group: SequenceGroup, recorder: RunRecorder, token_digests: dict[int, bytes],
                     groups: dict[int, SequenceGroup]) -> None:
    """Record a group that finished (its request row, token breaks and tokens' digest) and
    let it go.

    NOTE: a group and its sequences point at each other (``Sequence.group``): the last use
    of a finished group cuts that cycle, so reference counting frees them at once. Left to
    the cycle collector, the finished groups pile up until full collections walk them all
    (about 10% of a contiguous system's Azure replay).
    """
    request_id = group.request.request_id
    recorder.record_request(_request_row(group.request, group, "finished"))
    if group.token_breaks:
        recorder.token_breaks[request_id] = group.token_breaks
    token_digests[request_id] = _tokens_digest(group)
    groups.pop(request_id, None)
    for seq in group.seqs:
        seq.group = None


_LINEAGE = attrgetter("lineage")


def _tokens_digest(group: SequenceGroup) -> bytes:
    """sha256 of a finished group's generated tokens, sequences in lineage order."""
    digest = hashlib.sha256(group.request.request_id.to_bytes(8, "little"))
    seqs = group.seqs
    for seq in seqs if len(seqs) == 1 else sorted(seqs, key=_LINEAGE):
        digest.update(seq.num_generated.to_bytes(8, "little"))
        digest.update(seq.generated_ids())  # (native int64 bytes)
    return digest.digest()


def _request_row(request: Request, group: SequenceGroup | None, status: str) -> tuple:
    if group is None:  # rejected: it never ran
        return (request.request_id, request.name, request.arrival_time, None, None,
                request.prompt_len, request.output_len,
                max(request.num_samples, request.beam_width), 0, 0, 0, status)
    return (
        request.request_id, request.name, request.arrival_time,
        group.first_token_time, group.finish_time, request.prompt_len, request.output_len,
        group.width, group.cached_tokens, group.num_preemptions, group.num_swaps, status,
    )
