"""The workload-kind registry and what every builder receives and returns.

A kind is a spec dataclass plus a builder ``build(spec, ctx) -> list[Draft]``.
Builders record what they skipped, filtered, dropped or truncated in
``ctx.tally``; ``harness.workloads.build`` turns drafts into ``Request``s.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from harness.errors import ConfigError
from harness.workloads.spec import WorkloadSpec
from harness.workloads.tokens import TokenSpace


@dataclass(slots=True)
class Draft:
    """A request before ids are assigned: ``prompt`` is a read-only int32 array."""

    arrival_time: float
    prompt: np.ndarray
    output_len: int
    num_samples: int = 1
    beam_width: int = 1
    name: str = ""
    output_token_ids: np.ndarray | None = None
    component: str = ""  # which mixture component it came from ("" outside mixtures)


@dataclass
class Tally:
    """Counts of what happened to input rows, by reason (reported in the summary)."""

    rows_read: int = 0
    skipped: Counter = field(default_factory=Counter)  # malformed rows under on_error=skip
    filtered: Counter = field(default_factory=Counter)  # filters, failed requests, time window
    dropped: Counter = field(default_factory=Counter)  # longer than max_model_len, clip=drop
    truncated: Counter = field(default_factory=Counter)  # shortened to max_model_len, clip=truncate

    def merge(self, other: "Tally") -> None:
        self.rows_read += other.rows_read
        for mine, theirs in ((self.skipped, other.skipped), (self.filtered, other.filtered),
                             (self.dropped, other.dropped), (self.truncated, other.truncated)):
            mine.update(theirs)

    def as_dict(self) -> dict:
        def plain(counter: Counter) -> dict:
            return {"total": int(sum(counter.values())),
                    "by_reason": {str(k): int(v) for k, v in sorted(counter.items())}}
        return {"rows_read": int(self.rows_read), "skipped": plain(self.skipped),
                "filtered": plain(self.filtered), "dropped": plain(self.dropped),
                "truncated": plain(self.truncated)}


@dataclass
class BuildContext:
    """What a builder may use: seeded randomness, the token space, the context limit."""

    seed: int
    max_model_len: int
    tokens: TokenSpace
    where: str = "workload"  # key prefix for error messages ("workload.components[0]")
    tally: Tally = field(default_factory=Tally)
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(np.random.SeedSequence([int(self.seed), 0x5EED]))

    def child(self, index: int, where: str) -> "BuildContext":
        """A context for a mixture component: its own seed stream, the same token space."""
        seed = int(np.random.SeedSequence([int(self.seed), 0xC0, index]).generate_state(1)[0])
        return BuildContext(seed=seed, max_model_len=self.max_model_len, tokens=self.tokens, where=where)


Builder = Callable[[WorkloadSpec, BuildContext], "list[Draft]"]


@dataclass(frozen=True)
class Kind:
    name: str
    spec: type
    build: Builder
    doc: str


KINDS: dict[str, Kind] = {}


def register(name: str, spec: type) -> Callable[[Builder], Builder]:
    """Decorator: register ``build`` as workload kind ``name`` with spec dataclass ``spec``."""

    def wrap(build: Builder) -> Builder:
        if name in KINDS:
            raise RuntimeError(f"workload kind {name!r} registered twice")
        doc = (build.__doc__ or "").strip().splitlines()
        KINDS[name] = Kind(name, spec, build, doc[0] if doc else "")
        return build

    return wrap


def lookup(name: object, where: str = "workload") -> Kind:
    if not isinstance(name, str) or name not in KINDS:
        raise ConfigError(f"{where}.kind: unknown workload kind {name!r}. Known kinds: "
                          f"{', '.join(sorted(KINDS))}")
    return KINDS[name]


def clip_lengths(prompt_lens: np.ndarray, output_lens: np.ndarray, max_model_len: int, policy: str,
                 tally: Tally) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Apply the clip policy to requests with prompt + output > max_model_len.

    Returns (keep mask, new prompt lengths, new output lengths). ``truncate`` keeps
    the output if it fits (else max_model_len - 1 tokens of it) and the *head* of
    the prompt, so shared prefixes survive truncation.
    """
    prompt_lens = np.asarray(prompt_lens, dtype=np.int64)
    output_lens = np.asarray(output_lens, dtype=np.int64)
    too_long = prompt_lens + output_lens > max_model_len
    count = int(too_long.sum())
    if policy == "drop":
        if count:
            tally.dropped[f"longer than max_model_len={max_model_len}"] += count
        return ~too_long, prompt_lens, output_lens
    new_out = np.where(too_long, np.minimum(output_lens, max_model_len - 1), output_lens)
    new_prompt = np.where(too_long, np.minimum(prompt_lens, max_model_len - new_out), prompt_lens)
    if count:
        tally.truncated[f"longer than max_model_len={max_model_len}"] += count
    return np.ones(prompt_lens.shape, dtype=bool), new_prompt, new_out


def clip_drafts(drafts: list[Draft], max_model_len: int, policy: str, tally: Tally) -> list[Draft]:
    """``clip_lengths`` over drafts; prompts are sliced (views stay read-only)."""
    if not drafts:
        return drafts
    prompt = np.fromiter((len(d.prompt) for d in drafts), dtype=np.int64, count=len(drafts))
    output = np.fromiter((d.output_len for d in drafts), dtype=np.int64, count=len(drafts))
    keep, new_prompt, new_output = clip_lengths(prompt, output, max_model_len, policy, tally)
    result = []
    for draft, k, p, o in zip(drafts, keep.tolist(), new_prompt.tolist(), new_output.tolist()):
        if not k:
            continue
        if p != len(draft.prompt) or o != draft.output_len:
            draft.prompt = draft.prompt[:p]
            draft.output_len = o
            if draft.output_token_ids is not None:
                draft.output_token_ids = draft.output_token_ids[:o]
        result.append(draft)
    return result
