"""Generated workloads: fixed lengths, lognormal lengths, shared prefixes, document QA.

Everything random comes from ``ctx.rng`` (seeded) and every token id from
``ctx.tokens``, so a seed reproduces a workload exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.workloads.arrivals import generate_arrivals
from harness.workloads.registry import BuildContext, Draft, register
from harness.workloads.spec import LengthDist, SyntheticSpec, check, check_positive
from harness.workloads.tokens import readonly


def _drafts(ctx: BuildContext, spec: SyntheticSpec, prompts: list[np.ndarray], outputs: np.ndarray,
            names: list[str]) -> list[Draft]:
    times = generate_arrivals(spec.arrival, len(prompts), ctx.rng, f"{ctx.where}.arrival")
    return [Draft(arrival_time=float(t), prompt=p, output_len=int(o), name=n)
            for t, p, o, n in zip(times.tolist(), prompts, outputs.tolist(), names)]


@dataclass(frozen=True, kw_only=True)
class FixedSpec(SyntheticSpec):
    prompt_len: int
    output_len: int

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "prompt_len", "output_len", allow_none=False)


@register("fixed", FixedSpec)
def build_fixed(spec: FixedSpec, ctx: BuildContext) -> list[Draft]:
    """Every request has the same prompt and output length (unique tokens)."""
    n = spec.num_requests
    prompts = ctx.tokens.fresh_many(np.full(n, spec.prompt_len))
    return _drafts(ctx, spec, prompts, np.full(n, spec.output_len), [f"fixed/{i}" for i in range(n)])


@dataclass(frozen=True, kw_only=True)
class LognormalSpec(SyntheticSpec):
    input: LengthDist
    output: LengthDist


@register("lognormal", LognormalSpec)
def build_lognormal(spec: LognormalSpec, ctx: BuildContext) -> list[Draft]:
    """Independent lognormal prompt and output lengths (unique tokens)."""
    n = spec.num_requests
    prompt_lens = spec.input.sample(ctx.rng, n)
    output_lens = spec.output.sample(ctx.rng, n)
    prompts = ctx.tokens.fresh_many(prompt_lens)
    return _drafts(ctx, spec, prompts, output_lens, [f"{spec.name or 'lognormal'}/{i}" for i in range(n)])


@dataclass(frozen=True, kw_only=True)
class SharedPrefixSpec(SyntheticSpec):
    prefix_lens: tuple[int, ...]
    prefix_weights: tuple[float, ...] | None = None
    suffix: LengthDist
    output: LengthDist

    def __post_init__(self) -> None:
        super().__post_init__()
        check(len(self.prefix_lens) >= 1 and all(p >= 1 for p in self.prefix_lens), "prefix_lens",
              f"must be a non-empty list of lengths >= 1, e.g. [80, 341]; got {list(self.prefix_lens)}")
        if self.prefix_weights is not None:
            check(len(self.prefix_weights) == len(self.prefix_lens)
                  and all(w >= 0 for w in self.prefix_weights) and sum(self.prefix_weights) > 0,
                  "prefix_weights", "must give one non-negative weight per prefix (not all zero), or null")


@register("shared_prefix", SharedPrefixSpec)
def build_shared_prefix(spec: SharedPrefixSpec, ctx: BuildContext) -> list[Draft]:
    """Few-shot prompts: one of a few fixed prefixes, then a unique suffix."""
    n = spec.num_requests
    prefixes = [ctx.tokens.fresh(p) for p in spec.prefix_lens]
    weights = np.asarray(spec.prefix_weights or [1.0] * len(prefixes), dtype=np.float64)
    choice = ctx.rng.choice(len(prefixes), size=n, p=weights / weights.sum())
    suffixes = ctx.tokens.fresh_many(spec.suffix.sample(ctx.rng, n))
    outputs = spec.output.sample(ctx.rng, n)
    prompts = [readonly(np.concatenate([prefixes[c], s])) for c, s in zip(choice.tolist(), suffixes)]
    names = [f"shared_prefix/p{c}/{i}" for i, c in enumerate(choice.tolist())]
    return _drafts(ctx, spec, prompts, outputs, names)


@dataclass(frozen=True, kw_only=True)
class DocQASpec(SyntheticSpec):
    system_prompt_len: int = 200
    num_documents: int = 40
    zipf_alpha: float = 0.0  # document popularity: 0 = uniform, larger = more skewed
    document: LengthDist
    question: LengthDist
    answer: LengthDist

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.system_prompt_len >= 0, "system_prompt_len",
              f"must be >= 0 (0 = no system prompt), got {self.system_prompt_len!r}")
        check(self.num_documents >= 1, "num_documents", f"must be >= 1, got {self.num_documents!r}")
        check(self.zipf_alpha >= 0, "zipf_alpha", f"must be >= 0 (0 = uniform), got {self.zipf_alpha!r}")


@register("docqa", DocQASpec)
def build_docqa(spec: DocQASpec, ctx: BuildContext) -> list[Draft]:
    """System prompt + a document from a shared pool + a unique question; short answers."""
    n = spec.num_requests
    system = ctx.tokens.fresh(spec.system_prompt_len) if spec.system_prompt_len else np.empty(0, np.int32)
    documents = ctx.tokens.fresh_many(spec.document.sample(ctx.rng, spec.num_documents))
    popularity = 1.0 / np.arange(1, spec.num_documents + 1, dtype=np.float64) ** spec.zipf_alpha
    doc_of = ctx.rng.choice(spec.num_documents, size=n, p=popularity / popularity.sum())
    questions = ctx.tokens.fresh_many(spec.question.sample(ctx.rng, n))
    answers = spec.answer.sample(ctx.rng, n)
    prompts = [readonly(np.concatenate([system, documents[d], q])) for d, q in zip(doc_of.tolist(), questions)]
    names = [f"docqa/doc{d}/q{i}" for i, d in enumerate(doc_of.tolist())]
    return _drafts(ctx, spec, prompts, answers, names)

