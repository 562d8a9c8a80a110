"""The theory the harness checks against its own measurements (docs/memory.md)."""

import numpy as np
import pytest

from pagebench.allocators.registry import ContiguousKVCacheManager, PagedKVCacheManager


def test_a_17_token_sequence_in_16_token_blocks_uses_17_of_32_slots():
    m = PagedKVCacheManager(8, 16)
    m.admit(0, np.arange(17, dtype=np.int32), 17, 17)
    b = m.breakdown(False)
    assert (b.token_states, b.allocated_slots) == (17, 32)
    assert b.token_states / b.allocated_slots == 17 / 32
    assert b.internal_rounding == 15 and b.reserved == 0


@pytest.mark.parametrize("arena", ["buddy", "first_fit", "best_fit"])
def test_a_512_token_request_under_max_length_4096_wastes_87_5_percent(arena):
    m = ContiguousKVCacheManager(8192, policy="max", max_model_len=4096, arena=arena)
    m.admit(0, list(range(500)), 512, 500)
    m.append(0, list(range(12)))
    b = m.breakdown(False)
    assert b.token_states == 512 and b.reserved == 0
    assert b.internal_over_reservation / 4096 == 0.875 == 1 - 512 / 4096
    assert b.internal_rounding == 0


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_paged_internal_fragmentation_averages_half_a_block_per_sequence(block_size):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 2049, size=4000)
    num_blocks = int(sum(-(-lengths // block_size)))
    m = PagedKVCacheManager(num_blocks, block_size, enable_prefix_caching=False)
    for sid, length in enumerate(lengths.tolist()):
        prompt_len = max(1, length // 2)
        m.admit(sid, [0] * prompt_len, length, prompt_len)  # half prompt, half decode
        if length > prompt_len:
            m.append(sid, [0] * (length - prompt_len))
    b = m.breakdown(False)
    assert b.token_states == int(lengths.sum()) and b.reserved == 0 and b.idle == 0
    per_seq = b.internal_fragmentation / len(lengths)
    assert per_seq == pytest.approx((block_size - 1) / 2, rel=0.05)


def test_mid_generation_slack_of_the_last_block_is_reserved_not_fragmentation():
    m = PagedKVCacheManager(8, 16)
    m.admit(0, np.arange(10, dtype=np.int32), 40, 10)  # will end at 40: blocks 0..2
    b = m.breakdown(False)
    assert (b.token_states, b.reserved, b.internal_rounding) == (10, 6, 0)
    m.append(0, np.arange(10, 37, dtype=np.int32))
    b = m.breakdown(False)
    assert (b.token_states, b.reserved, b.internal_rounding) == (37, 3, 8)
