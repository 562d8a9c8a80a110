"""The hybrid prefix cache's memoised hit (``GroupPrefixCache.hit``, kept until a block of
the hit is evicted or a block gets a key of the prompt) equals a fresh scan at every call
of an engine run: shared prefixes, a pool small enough to evict them, windows of a few
blocks, preempted requests whose generated tokens come back as a prompt, and prefixes
keyed chunk by chunk while the next request with them waits."""

from __future__ import annotations

import numpy as np
import pytest

from engine_helpers import HARDWARE, engine_spec, make_requests
from harness.config.specs import ModelSpec, SystemSpec
from harness.config.systems import build_manager
from harness.engine.engine import run_engine
from harness.engine.executors import make_executor
from harness.engine.scheduler import Scheduler
from pagebench.allocators.hybrid_layout import GroupPrefixCache

MODEL = ModelSpec(name="local", num_layers=6, hidden_size=64, num_heads=4, num_kv_heads=2,
                  head_dim=16, intermediate_size=128, vocab_size=1000, max_context=4096,
                  architecture="gemma3", sliding_window=40,
                  layer_pattern=("sliding", "sliding", "full"))


@pytest.mark.parametrize("chunk", [None, 48])  # chunked prefill: a prefix keyed chunk by chunk
@pytest.mark.parametrize("fast_forward", [False, True])
@pytest.mark.parametrize("capacity", [512, 1024, 2048])
def test_the_memoised_hit_equals_a_fresh_scan(capacity, fast_forward, chunk, monkeypatch):
    memoised = GroupPrefixCache.hit
    calls = {"memo": 0, "all": 0}

    def checked(cache, data):
        before = cache._memo
        answer = memoised(cache, data)
        kept = cache._memo
        cache._memo = None  # forget it: a fresh scan
        assert memoised(cache, data) == answer
        cache._memo = kept  # (the memo lives on as if never checked)
        calls["all"] += 1
        calls["memo"] += kept is before
        return answer

    monkeypatch.setattr(GroupPrefixCache, "hit", checked)
    rng = np.random.default_rng(capacity)
    lengths = [(int(p), int(o)) for p, o in zip(rng.integers(90, 300, 40), rng.integers(1, 200, 40))]
    requests = make_requests(lengths, gap=0.003, prefix=np.arange(80, dtype=np.int32), seed=capacity)
    system = SystemSpec(name="paged_hybrid", kind="paged_hybrid", prefix_caching=True, block_size=8)
    spec = engine_spec(kv_capacity_slots=capacity, fast_forward=fast_forward,
                       **({"chunked_prefill": True, "max_num_batched_tokens": chunk} if chunk else {}))
    manager = build_manager(system, capacity, MODEL, spec, 4096)
    executor = make_executor(spec, system, MODEL, HARDWARE, manager)
    result = run_engine(requests, Scheduler(manager, spec), executor, spec, max_model_len=4096)
    assert result.scheduler.prompt_tokens_cached > 0
    assert calls["all"] > 50 and calls["memo"] > 10  # the memo answered often
