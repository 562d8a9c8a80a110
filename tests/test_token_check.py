"""The token check: agreement between systems, the teacher-forced replay through the dense
reference, the measured noise bound, and a planted cache bug it must catch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.engine.token_check import (check_systems, console_line, noise_bound, teacher_forced,
                                        token_agreement)
from torch_helpers import (TINY, _request, contiguous, dense_greedy, engine, one_torch_thread,  # noqa: F401
                           paged, run_torch)


def test_agreement_counts_identical_requests_and_the_first_divergence():
    tokens = {"paged": {0: [1, 2, 3], 1: [4, 5, 6], 2: [7]},
              "max": {0: [1, 2, 3], 1: [4, 9, 6], 2: [8]}}
    got = token_agreement(tokens)["systems"]["max"]
    assert got["requests_compared"] == 3 and got["identical_share"] == pytest.approx(1 / 3, abs=1e-4)
    assert got["first_divergence"] == {"min": 0, "median": 0.5, "max": 1}


def _model(batch_invariant: bool):
    from harness.engine.torch_device import get_model

    return get_model(TINY, torch.device("cpu"), 0, batch_invariant)


def test_teacher_forced_accepts_the_reference_and_names_a_wrong_token():
    model = _model(False)
    prompt = np.arange(3, 40, dtype=np.int64)
    good = dense_greedy(model, prompt, 6)
    ok = teacher_forced(model, prompt, good, bound=0.0)
    assert (ok["tokens"], ok["top1"], ok["beyond_noise"], ok["worst"]) == (6, 6, 0, None)
    # position 2 replaced by the reference's least likely token there (every later
    # position is still judged against the dense logits of the tokens as given)
    logits = model.dense_logits(torch.as_tensor(np.concatenate([prompt, good[:2]])))[-1]
    bad = good[:2] + [int(logits.argmin())] + good[3:]
    got = teacher_forced(model, prompt, bad, bound=0.0)
    assert got["beyond_noise"] >= 1 and got["worst"]["position"] == 2
    assert got["worst"]["margin"] == pytest.approx(float(logits.max() - logits.min()), rel=1e-5)
    # a bound above that margin calls it noise
    assert teacher_forced(model, prompt, bad, bound=got["max_margin"] + 1)["beyond_noise"] == 0


def test_the_float64_path_has_no_batch_composition_noise():
    sequences = [np.arange(5, 30, dtype=np.int64), np.arange(100, 140, dtype=np.int64)]
    assert noise_bound(_model(True), sequences) == 0.0


def _workload():
    # prompts of 40-70 tokens: 3-5 blocks of 16, so the first block is read at every step
    rng = np.random.default_rng(11)
    return tuple(_request(i, rng.integers(0, 1 << 29, int(rng.integers(40, 70)), dtype=np.int32), 8)
                 for i in range(4))


def _greedy_tokens(run) -> dict[int, list[int]]:
    return {rid: samples[0] for rid, samples in run.tokens.items()}


def test_a_planted_block_table_bug_fails_the_check_and_the_correct_run_passes():
    requests = _workload()
    fast = engine(batch_invariant=False)
    oracle = run_torch(requests, contiguous("oracle"), fast, poison=False)
    good = run_torch(requests, paged(16), fast, poison=False)
    prompts = {r.request_id: np.asarray(r.prompt_token_ids, dtype=np.int64) for r in requests}
    model = good.executor.model
    passed = check_systems(model, prompts, {"oracle": _greedy_tokens(oracle), "paged": _greedy_tokens(good)})
    assert passed["verdict"] in ("identical", "equivalent") and passed["failed_systems"] == []
    assert passed["teacher_forced"]["paged"]["tokens"] == 4 * 8

    from pagebench.allocators.paged import PagedKVCacheManager

    real = PagedKVCacheManager.block_table

    def wrong_first_block(self, seq_id):  # the bug: entry 0 names the next block
        table = list(real(self, seq_id))
        return [(table[0] + 1) % self.num_blocks] + table[1:]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PagedKVCacheManager, "block_table", wrong_first_block)
        buggy = run_torch(requests, paged(16), fast, poison=False)
    report = check_systems(model, prompts, {"oracle": _greedy_tokens(oracle), "paged": _greedy_tokens(buggy)})
    assert report["verdict"] == "failed" and report["failed_systems"] == ["paged"]
    assert report["teacher_forced"]["oracle"]["beyond_noise"] == 0
    assert report["teacher_forced"]["paged"]["beyond_noise"] > 0
    assert console_line(report).startswith("error: token check FAILED: paged")
