"""``can_admit`` predicts ``admit`` exactly, on pools in many states (paged with a prefix
cache, contiguous on every arena)."""

import numpy as np
import pytest

from pagebench.allocators.registry import ContiguousKVCacheManager, PagedKVCacheManager

PROMPTS = [np.arange(start, start + 200, dtype=np.int32) for start in (0, 10_000)]


def _managers():
    yield "paged", PagedKVCacheManager(24, 8, enable_prefix_caching=True)
    yield "paged_noprefix", PagedKVCacheManager(24, 8, enable_prefix_caching=False)
    for policy in ("max", "pow2", "oracle"):
        for arena in ("buddy", "first_fit", "best_fit"):
            yield f"{policy}_{arena}", ContiguousKVCacheManager(600, policy=policy, arena=arena,
                                                                max_model_len=160)


@pytest.mark.parametrize("name,manager", list(_managers()), ids=lambda v: v if isinstance(v, str) else "")
def test_can_admit_agrees_with_admit(name, manager):
    rng = np.random.default_rng(len(name))
    live: list[int] = []
    checked = refused = 0
    for seq_id in range(400):
        if live and rng.random() < 0.45:  # free one (sometimes after it grew)
            victim = live.pop(int(rng.integers(len(live))))
            manager.free(victim)
            continue
        # shared prefixes, so paged admissions hit cached (and cached free) blocks
        prompt = PROMPTS[int(rng.integers(2))][:int(rng.integers(1, 100))]
        final_len = len(prompt) + int(rng.integers(0, 60))
        num_tokens = int(rng.integers(1, len(prompt) + 1))
        predicted = manager.can_admit(prompt, final_len, num_tokens)
        admission = manager.admit(seq_id, prompt, final_len, num_tokens)
        admitted = admission is not None
        assert predicted == admitted, (seq_id, len(prompt), final_len, num_tokens)
        checked += 1
        refused += not admitted
        if admitted:
            live.append(seq_id)
            held = max(num_tokens, admission.num_cached_tokens)
            if rng.random() < 0.5 and final_len > held:
                manager.append(seq_id, np.arange(final_len - held, dtype=np.int32) + 50_000)
    assert checked > 100 and 10 < refused < checked - 10  # both outcomes, many times
