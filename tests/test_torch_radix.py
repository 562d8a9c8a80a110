"""The radix manager on the torch executor (issue 24): its pages are the paged layout's
blocks, so radix and paged generate the same tokens and, page for page, reuse the same
cached prefix; a system without a tensor layout (vattention) is refused before any run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir

from harness.config.specs import select_systems
from harness.errors import ConfigError
from harness.run.run_setup import run_setup
from harness.workloads.build import build_workload
from torch_helpers import (MAX_MODEL_LEN, ROOT, beam_workload, engine, mixed_workload,  # noqa: F401
                           one_torch_thread, run_torch)

BLOCK = 16
CATALOG = yaml.safe_load((ROOT / "conf" / "allocator" / "standard.yaml").read_text())
# paged: prefix caching on (vLLM's); radix: page 1 (SGLang's); radix_block: page = BLOCK
SYSTEMS = {s.name: s for s in select_systems(["paged", "paged_noprefix", "radix", "radix_block"],
                                             CATALOG, BLOCK)}
# docqa, shrunk: a 20-token system prompt, 3 documents shared by 10 questions; one step
# admits every prompt (640 tokens < max_num_batched_tokens), in request order
DOCQA = dict(kind="docqa", num_requests=10, arrival={"process": "offline"}, system_prompt_len=20,
             num_documents=3, document={"mean": 50, "sigma": 0.3, "min": 20, "max": 90},
             question={"mean": 8, "sigma": 0.3, "min": 3, "max": 12},
             answer={"mean": 6, "sigma": 0.3, "min": 2, "max": 10})
SPEC = engine(kv_capacity_slots=1024, max_num_batched_tokens=1024)  # no eviction, no chunking


def expected_hits(requests, page: int) -> int:
    """Theory, independent of either manager: each prompt reuses its longest common prefix
    with an earlier prompt, at most ``len - 1`` tokens (one is computed), in whole pages."""
    total = 0
    for i, request in enumerate(requests):
        ids = request.prompt_token_ids
        best = 0
        for earlier in requests[:i]:
            other = earlier.prompt_token_ids
            n = min(len(ids), len(other))
            differ = np.flatnonzero(ids[:n] != other[:n])
            best = max(best, int(differ[0]) if differ.size else n)
        total += min(best, len(ids) - 1) // page * page
    return total


@pytest.fixture(scope="module")
def docqa_runs():
    requests = build_workload(DOCQA, seed=0, max_model_len=MAX_MODEL_LEN).requests
    before = torch.get_num_threads()  # (module scope: set up before one_torch_thread)
    torch.set_num_threads(1)
    try:
        runs = {name: run_torch(requests, system, SPEC) for name, system in SYSTEMS.items()}
    finally:
        torch.set_num_threads(before)
    return requests, runs


def test_radix_and_paged_generate_identical_tokens_on_docqa(docqa_runs):
    _, runs = docqa_runs
    digests = {name: run.digest for name, run in runs.items()}
    assert len(set(digests.values())) == 1, digests
    assert all(run.run.complete and len(run.tokens) == 10 for run in runs.values())


def test_radix_block_and_paged_reuse_the_same_prefix_tokens(docqa_runs):
    requests, runs = docqa_runs
    hits = {name: run.executor.manager.stats.prefix_hit_tokens for name, run in runs.items()}
    # block = page = 16: both match whole blocks of an earlier prompt, capped at len - 1
    assert hits["paged"] == hits["radix_block"] == expected_hits(requests, BLOCK) > 0
    # page 1: every common token (the document's tail past its last full block too)
    assert hits["radix"] == expected_hits(requests, 1) > hits["radix_block"]
    assert hits["paged_noprefix"] == 0


@pytest.mark.parametrize("page", [1, 4, BLOCK])
@pytest.mark.parametrize("workload", [mixed_workload, beam_workload], ids=["parallel", "beam"])
def test_radix_forks_copy_slots_and_match_paged(workload, page):
    """Forks (parallel samples, beams) copy the parent's private slots, not blocks; NaN-poisoned
    memory shows any slot left unwritten."""
    radix = select_systems(["radix"], {"radix": {"kind": "radix", "page_size": page}}, BLOCK)[0]
    requests = workload()
    expected = run_torch(requests, SYSTEMS["paged_noprefix"], SPEC)
    got = run_torch(requests, radix, SPEC)
    assert got.tokens == expected.tokens
    assert got.executor.manager.stats.fork_copies > 0 or page == 1


def test_engine_torch_refuses_a_system_without_a_tensor_layout_before_any_run():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["engine=torch", "model=tiny",
                                           "systems=[paged,radix,vattention]"])
        sim = compose("config", overrides=["model=tiny", "systems=[paged,radix,vattention]"])
    with pytest.raises(ConfigError, match=r"^systems: vattention \(vattention\) has no KV tensor "
                                          r"layout for engine=torch; run it with engine=sim"):
        run_setup(cfg)
    assert [s.name for s in run_setup(sim).systems] == ["paged", "radix", "vattention"]
