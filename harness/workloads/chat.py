"""Multi-turn chat: each turn's prompt is the whole conversation so far plus a new message.

Turn k of a session sends ``system + user_1 + answer_1 + ... + user_k`` and
generates ``answer_k``, whose ids are set as the request's ``output_token_ids``
so that turn k+1 really contains what turn k generated (prefix reuse across
turns). Sessions start by the arrival process; the workload is open loop, so
turn k+1 arrives ``answer_k * assumed_tpot_s + think time`` after turn k
arrives (think time exponential with mean ``think_time_s``), without waiting
for the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.workloads.arrivals import generate_arrivals
from harness.workloads.registry import BuildContext, Draft, register
from harness.workloads.spec import LengthDist, SyntheticSpec, check


@dataclass(frozen=True, kw_only=True)
class ChatSpec(SyntheticSpec):
    system_prompt_len: int = 0  # shared by every session
    turns: LengthDist  # turns per session
    user: LengthDist
    assistant: LengthDist
    think_time_s: float = 10.0
    assumed_tpot_s: float = 0.05

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.system_prompt_len >= 0, "system_prompt_len", f"must be >= 0, got {self.system_prompt_len!r}")
        check(self.think_time_s >= 0, "think_time_s", f"must be >= 0 seconds, got {self.think_time_s!r}")
        check(self.assumed_tpot_s >= 0, "assumed_tpot_s", f"must be >= 0 seconds, got {self.assumed_tpot_s!r}")


@register("chat", ChatSpec)
def build_chat(spec: ChatSpec, ctx: BuildContext) -> list[Draft]:
    """Multi-turn sessions; each turn resends the conversation so far (the first N turns by arrival)."""
    n = spec.num_requests
    rng = ctx.rng
    turns = spec.turns.sample(rng, n)  # n sessions always suffice for n turns
    num_sessions = int(np.searchsorted(np.cumsum(turns), n)) + 1
    turns = turns[:num_sessions]
    starts = generate_arrivals(spec.arrival, num_sessions, rng, f"{ctx.where}.arrival")
    system = ctx.tokens.fresh(spec.system_prompt_len) if spec.system_prompt_len else np.empty(0, np.int32)
    drafts: list[Draft] = []
    for session, (start, num_turns) in enumerate(zip(starts.tolist(), turns.tolist())):
        user = spec.user.sample(rng, num_turns)
        answer = spec.assistant.sample(rng, num_turns)
        pieces = ctx.tokens.fresh_many(np.stack([user, answer], axis=1).ravel())
        conversation = np.concatenate([system, *pieces])  # system u1 a1 u2 a2 ...
        conversation.setflags(write=False)
        segment_ends = len(system) + np.cumsum(np.stack([user, answer], axis=1).ravel())
        gaps = answer * spec.assumed_tpot_s + rng.exponential(spec.think_time_s, size=num_turns) \
            if spec.think_time_s > 0 else answer * spec.assumed_tpot_s
        time = start
        for k in range(num_turns):
            user_end, answer_end = int(segment_ends[2 * k]), int(segment_ends[2 * k + 1])
            drafts.append(Draft(arrival_time=time, prompt=conversation[:user_end], output_len=int(answer[k]),
                                name=f"chat/s{session}/t{k}",
                                output_token_ids=conversation[user_end:answer_end]))
            time += float(gaps[k])
    drafts.sort(key=lambda d: d.arrival_time)
    return drafts[:n]
