"""Do the systems of a real-engine run compute the same model? Token agreement between
systems and a teacher-forced check of each system's tokens against the dense reference.

On CPU (``engine.batch_invariant``, the float64 path) paged, max and oracle generate
identical tokens. In the fast mode (fp16 kernels on the GPU) a token's logits depend on
the batch it ran in (GEMM tiling, split-K), so a near-tie can flip an argmax and the
systems' outputs diverge from there on: identical digests cannot be required. What can:

- **agreement** (``token_agreement``): per system against the first, the share of
  requests whose tokens are identical and, for the others, the output position of the
  first difference;
- **teacher-forced check** (``teacher_forced``): each system's prompt + generated tokens
  replayed through the dense no-cache reference (``DecoderModel.dense_logits``, one
  sequence at a time): at every generated position the system's token must be the
  reference's top-1, or its logit margin (top-1 logit minus the token's) must be within
  the **noise bound**;
- **noise bound** (``noise_bound``): measured, not assumed: the largest logit difference
  between a sequence's dense logits alone and the same sequence run behind another one in
  the same forward (other GEMM row counts, the batch variance itself), doubled (the
  system's run and the reference each carry up to that error). In the float64 batch-
  invariant mode it is 0: tokens must match exactly.

A cache bug (a block table pointing at another block, a slot written twice) feeds the
model wrong keys: the tokens it produces are then not the reference's top-1 by far more
than rounding, and the check fails (tests/test_token_check.py plants one). Like vLLM's
batch-invariance tests (tests/v1/determinism), the comparison is against a reference
computed another way, with a negative control.
"""

from __future__ import annotations

import numpy as np
import torch

# distinct token sequences replayed per system (the diverging ones first): each is one
# dense forward of its whole length
MAX_CHECKED = 8
NOISE_SEQUENCES = 2  # sequences whose batch-composition noise is measured


def token_agreement(tokens: dict[str, dict[int, list[int]]]) -> dict:
    """Per system against the first: requests compared, share identical, first divergence
    (output position) of the others: min, median, max."""
    names = list(tokens)
    if len(names) < 2:
        return {}
    base = tokens[names[0]]
    out = {"reference_system": names[0], "systems": {}}
    for name in names[1:]:
        other = tokens[name]
        common = sorted(set(base) & set(other))
        firsts = []
        for rid in common:
            a, b = base[rid], other[rid]
            if a != b:
                firsts.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
        same = len(common) - len(firsts)
        out["systems"][name] = {
            "requests_compared": len(common),
            "identical_share": round(same / len(common), 4) if common else None,
            "first_divergence": ({"min": int(min(firsts)), "median": float(np.median(firsts)),
                                  "max": int(max(firsts))} if firsts else None)}
    return out


@torch.inference_mode()
def noise_bound(model, sequences: list[np.ndarray]) -> float:
    """Twice the largest logit difference between a sequence alone and behind another
    sequence in one forward (module docstring); 0 when nothing differs."""
    from harness.engine.model import dense_causal_attention

    worst = 0.0
    for i, seq in enumerate(sequences[:NOISE_SEQUENCES]):
        lead = sequences[(i + 1) % len(sequences)] if len(sequences) > 1 else seq
        alone = model.dense_logits(torch.as_tensor(seq, dtype=torch.long))  # [n, vocab]
        n, m = len(seq), len(lead)
        tokens = torch.as_tensor(np.concatenate([lead, seq]), dtype=torch.long, device=model.device)
        positions = torch.cat([torch.arange(m), torch.arange(n)]).to(model.device)

        def attend(_layer, q, k, v):  # block-diagonal: each sequence sees only itself
            out = torch.empty_like(q)
            for lo, hi in ((0, m), (m, m + n)):
                out[lo:hi] = dense_causal_attention(q[lo:hi], k[lo:hi], v[lo:hi], 0,
                                                    batch_invariant=model.batch_invariant,
                                                    scale=model.scale, window=model.window)
            return out

        batched = model.logits(model.forward(tokens, positions, attend))[m:]  # [n, vocab]
        worst = max(worst, float((batched - alone).abs().max()))
    return 2.0 * worst


@torch.inference_mode()
def teacher_forced(model, prompt: np.ndarray, generated: list[int], bound: float) -> dict:
    """The system's ``generated`` tokens against the dense reference's logits at each
    position: top-1 matches, ties within ``bound``, and the worst failure."""
    if not generated:
        return {"tokens": 0, "top1": 0, "within_noise": 0, "beyond_noise": 0, "worst": None}
    seq = np.concatenate([np.asarray(prompt, dtype=np.int64), np.asarray(generated[:-1], dtype=np.int64)])
    logits = model.dense_logits(torch.as_tensor(seq % model.vocab_size, dtype=torch.long))
    logits = logits[len(prompt) - 1:]  # [len(generated), vocab]: predicts each generated token
    chosen = torch.as_tensor(generated, dtype=torch.long, device=logits.device) % model.vocab_size
    top = logits.max(dim=-1)
    margin = (top.values - logits.gather(1, chosen[:, None])[:, 0]).cpu().numpy()  # [n] >= 0
    top1 = margin == 0
    beyond = ~top1 & (margin > bound)
    worst = None
    if beyond.any():
        at = int(np.argmax(np.where(beyond, margin, -1.0)))
        worst = {"position": at, "margin": round(float(margin[at]), 6),
                 "token": int(generated[at]), "reference_top1": int(top.indices[at])}
    return {"tokens": len(generated), "top1": int(top1.sum()),
            "within_noise": int((~top1 & ~beyond).sum()), "beyond_noise": int(beyond.sum()),
            "max_margin": round(float(margin.max()), 6), "worst": worst}


def check_systems(model, prompts: dict[int, np.ndarray], tokens: dict[str, dict[int, list[int]]],
                  *, max_checked: int = MAX_CHECKED) -> dict:
    """Agreement, the measured noise bound and each system's teacher-forced check; the
    verdict: ``identical``, ``equivalent`` (differences within the noise) or ``failed``."""
    agreement = token_agreement(tokens)
    names = list(tokens)
    diverging = set()
    if len(names) > 1:
        base = tokens[names[0]]
        diverging = {rid for name in names[1:] for rid, toks in tokens[name].items()
                     if rid in base and base[rid] != toks}
    samples = [np.concatenate([prompts[rid], np.asarray(toks, dtype=np.int64)]).astype(np.int64)
               % model.vocab_size for rid, toks in list(tokens[names[0]].items())[:NOISE_SEQUENCES]
               if rid in prompts]
    bound = noise_bound(model, samples) if samples else 0.0
    checks = {}
    for name, by_request in tokens.items():
        order = sorted(by_request, key=lambda rid: (rid not in diverging, rid))
        seen, totals, worst = set(), {"tokens": 0, "top1": 0, "within_noise": 0, "beyond_noise": 0}, None
        checked = 0
        for rid in order:
            key = tuple(by_request[rid])
            if (rid, key) in seen or rid not in prompts or checked >= max_checked:
                continue
            seen.add((rid, key))
            checked += 1
            got = teacher_forced(model, prompts[rid], by_request[rid], bound)
            for k in totals:
                totals[k] += got[k]
            if got["worst"] is not None and (worst is None or got["worst"]["margin"] > worst["margin"]):
                worst = {"request_id": int(rid), **got["worst"]}
        checks[name] = {"requests_checked": checked, **totals, "worst_failure": worst}
    failed = [n for n, c in checks.items() if c["beyond_noise"]]
    identical = len(names) > 1 and all(s["identical_share"] == 1.0 for s in agreement["systems"].values())
    verdict = "failed" if failed else ("identical" if identical else "equivalent")
    return {"agreement": agreement, "noise_bound": round(bound, 6), "teacher_forced": checks,
            "verdict": verdict, "failed_systems": failed}


def console_line(report: dict) -> str:
    """What happened, in one line."""
    parts = []
    for name, s in (report["agreement"].get("systems") or {}).items():
        first = s["first_divergence"]
        parts.append(f"{name} {100 * s['identical_share']:.0f}% identical to "
                     f"{report['agreement']['reference_system']}"
                     + (f" (first divergence at output token {first['min']}-{first['max']})" if first else ""))
    agree = "; ".join(parts)
    if report["verdict"] == "failed":
        worst = {n: report["teacher_forced"][n]["worst_failure"] for n in report["failed_systems"]}
        return (f"error: token check FAILED: {', '.join(report['failed_systems'])} generated tokens the "
                f"dense reference ranks below its top-1 by more than the fp noise bound "
                f"{report['noise_bound']:.4g} (worst: {worst}): a cache bug, not rounding. {agree}")
    if report["verdict"] == "identical":
        return f"tokens: every system generated identical tokens; teacher-forced check passed. {agree}"
    return (f"tokens: the systems differ ({agree}); teacher-forced check passed: every token is the "
            f"dense reference's top-1 or within the measured fp noise bound {report['noise_bound']:.4g} "
            "of it (batch-variant rounding, not a cache bug)")


def report_tokens(results: dict, requests, model_spec, engine, seed: int) -> dict | None:
    """The check of a torch run's systems (their ``executor._tokens``, removed from
    ``results`` here) into ``results["token_check"]``, said on the console."""
    import sys

    from harness.engine.torch_device import get_model, resolve_batch_invariant, resolve_device

    tokens = {}
    for name, entry in results["systems"].items():
        executor = entry.get("executor")
        if isinstance(executor, dict) and "_tokens" in executor:
            tokens[name] = {int(rid): toks for rid, toks in executor.pop("_tokens").items()}
    if not tokens:
        return None
    device = resolve_device(engine.device)
    model = get_model(model_spec, device, seed, resolve_batch_invariant(engine, device))
    prompts = {r.request_id: np.asarray(r.prompt_token_ids, dtype=np.int64) for r in requests}
    report = check_systems(model, prompts, tokens)
    results["token_check"] = report
    print(console_line(report), file=sys.stderr)
    return report
