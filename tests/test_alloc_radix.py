"""Radix-tree prefix cache: exact pages, nodes, locks, hits and evictions on tiny pools,
and its bad input."""

from __future__ import annotations

import pytest

from pagebench.allocators.radix import RadixKVCacheManager
from engine_helpers import engine_spec, make_requests, paged, run
from harness.config.specs import select_systems
from harness.errors import ConfigError


def nodes(m):
    """Every node below the root as (key, pages, lock_ref), depth first, children by key."""
    out, stack = [], [m.root]
    while stack:
        node = stack.pop()
        for key in sorted(node.children, reverse=True):
            stack.append(node.children[key])
        if node is not m.root:
            out.append((node.key, node.pages, node.lock_ref))
    return out


def test_a_prompt_joins_the_tree_after_its_prefill_and_a_longer_prompt_matches_it_token_by_token():
    m = RadixKVCacheManager(16, 1)
    m.admit(0, [1, 2, 3, 4, 5], final_len=7, num_tokens=5)
    assert nodes(m) == [((1, 2, 3, 4, 5), [0, 1, 2, 3, 4], 1)]  # locked while it runs
    m.append(0, [6])
    m.free(0)  # its decode token joins below the prompt; nothing is locked now
    assert nodes(m) == [((1, 2, 3, 4, 5), [0, 1, 2, 3, 4], 0), ((6,), [5], 0)]
    b = m.breakdown(False)
    assert (b.allocated_slots, b.cached_free_slots, b.token_states) == (0, 6, 0)
    # a prompt sharing 3 tokens: the node splits after them; its own 2 join after prefill
    got = m.admit(1, [1, 2, 3, 9, 9], final_len=6, num_tokens=5)
    assert got.num_cached_tokens == 3
    assert nodes(m) == [((1, 2, 3), [0, 1, 2], 1), ((4, 5), [3, 4], 0), ((6,), [5], 0),
                        ((9, 9), [6, 7], 1)]
    assert m.slot_mapping(1, 0, 5) == [0, 1, 2, 6, 7]
    b = m.breakdown(False)
    # 5 tokens in locked pages; its last token takes a page when it comes; 3 cached free
    assert (b.token_states, b.reserved, b.allocated_slots, b.cached_free_slots) == (5, 0, 5, 3)
    assert (m.stats.prefix_queried_tokens, m.stats.prefix_hit_tokens) == (10, 3)


def test_a_match_is_capped_one_token_short_of_the_prompt():
    m = RadixKVCacheManager(16, 1)
    m.admit(0, [1, 2, 3], final_len=3, num_tokens=3)
    m.free(0)
    assert m.cached_prefix_tokens([1, 2, 3]) == 2  # the last prompt token is computed
    assert m.cached_prefix_tokens([1, 2, 3, 4]) == 3


def test_page_granular_matching_stops_at_the_last_whole_page():
    m = RadixKVCacheManager(8, 4)
    m.admit(0, list(range(10)), final_len=10, num_tokens=10)  # pages 0, 1, 2 (2 of 4 used)
    m.free(0)  # two full pages inserted; the partial third is freed
    assert nodes(m) == [(tuple(range(8)), [0, 1], 0)]
    assert m.cached_prefix_tokens(list(range(6)) + [99, 99, 99]) == 4  # 6 shared: 1 page
    assert m.cached_prefix_tokens(list(range(12))) == 8


def test_unlocked_leaves_are_evicted_least_recently_used_first_when_memory_is_short():
    m = RadixKVCacheManager(6, 1)
    m.admit(0, [1, 1], final_len=2, num_tokens=2)
    m.free(0)  # leaf (1, 1): pages 0, 1
    m.admit(1, [2, 2], final_len=2, num_tokens=2)
    m.free(1)  # leaf (2, 2): pages 2, 3, used later
    assert m.admit(2, [3, 3, 3, 3], final_len=4, num_tokens=4) is not None
    # 2 free pages (4, 5) + 2 evicted: the least recently used leaf (1, 1) goes, and the
    # free pages are handed out lowest first; the running prompt is cached (locked)
    assert nodes(m) == [((2, 2), [2, 3], 0), ((3, 3, 3, 3), [0, 1, 4, 5], 1)]
    assert m.slot_mapping(2, 0, 4) == [0, 1, 4, 5]
    assert m.stats.evicted_slots == 2
    m.free(2)  # (3, 3, 3, 3) on pages 0, 1, 4, 5 is unlocked now
    assert m.admit(3, [2, 2, 7], final_len=3, num_tokens=3).num_cached_tokens == 2
    # one page needed and none free: the only unlocked leaf goes, never the locked (2, 2)
    assert nodes(m) == [((2, 2), [2, 3], 1), ((7,), [0], 1)]
    assert m.slot_mapping(3, 0, 3) == [2, 3, 0]
    assert m.stats.evicted_slots == 6
    assert not m.can_admit([5] * 6, final_len=6, num_tokens=6)  # 3 free, 3 locked or in use
    assert m.admit(4, [5] * 6, final_len=6, num_tokens=6) is None


def test_two_prefills_of_the_same_prompt_at_once_keep_one_copy_and_free_the_other():
    m = RadixKVCacheManager(16, 2)
    for seq_id in (0, 1):  # first chunks of one token: no full page, nothing cached yet
        assert m.admit(seq_id, [4, 4, 4, 4, 8], final_len=5, num_tokens=1).num_cached_tokens == 0
    m.append(0, [4, 4, 4])  # pages 0, 2: cached and locked
    m.append(1, [4, 4, 4])  # pages 1, 3 duplicate them: freed; it uses pages 0, 2 now
    assert nodes(m) == [((4, 4, 4, 4), [0, 2], 2)]
    assert m.slot_mapping(1, 0, 4) == m.slot_mapping(0, 0, 4) == [0, 1, 4, 5]
    b = m.breakdown(False)
    assert (b.token_states, b.logical_tokens, b.allocated_slots) == (4, 8, 4)
    assert len(m._free) == 16 - 2


def test_radix_serves_a_shared_prefix_workload_with_the_same_tokens_as_paged():
    prefix = make_requests([(64, 1)])[0].prompt_token_ids
    requests = make_requests([(100, 20)] * 6, gap=0.5, prefix=prefix)
    spec = engine_spec(kv_capacity_slots=1024)
    radix_system = select_systems(["radix"], {"radix": {"kind": "radix", "page_size": 1}}, 16)[0]
    mine, reference = run(requests, radix_system, spec), run(requests, paged(16, True), spec)
    assert mine.complete and mine.output_digest == reference.output_digest
    # requests arrive after the previous one ended: each after the first reuses the prefix
    assert mine.scheduler.manager.stats.prefix_hit_tokens == 5 * 64


@pytest.mark.parametrize("page_size", [3, 0, 32, "x"])
def test_a_radix_page_size_that_does_not_divide_the_block_size_is_an_error_naming_the_key(page_size):
    with pytest.raises(ConfigError, match=r"^allocator\.radix\.page_size: must be a positive "
                                          r"divisor of the block size 16"):
        select_systems(["radix"], {"radix": {"kind": "radix", "page_size": page_size}}, 16)
