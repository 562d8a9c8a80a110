"""Token ids: fresh ids never collide; hash-derived blocks are equal exactly when hashes are."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.workloads.tokens import ID_SPACE, UNIQUE_BASE, TokenSpace


def test_fresh_ids_are_unique_readonly_int32_and_in_range():
    space = TokenSpace(seed=3)
    parts = space.fresh_many(np.array([5, 0, 1000, 17])) + [space.fresh(300_000)]
    ids = np.concatenate(parts)
    assert len(np.unique(ids)) == len(ids) == 301_022
    assert ids.min() >= UNIQUE_BASE and ids.max() < ID_SPACE
    for part in parts:
        assert part.dtype == np.int32 and not part.flags.writeable


def test_fresh_ids_depend_on_the_seed_and_repeat_with_it():
    assert np.array_equal(TokenSpace(1).fresh(50), TokenSpace(1).fresh(50))
    assert not np.array_equal(TokenSpace(1).fresh(50), TokenSpace(2).fresh(50))


def blocks_of(space, hash_lists, lengths, block_tokens):
    offsets = np.concatenate([[0], np.cumsum([len(h) for h in hash_lists])])
    flat = np.concatenate([np.asarray(h, dtype=np.int64) for h in hash_lists])
    return space.from_hash_blocks(flat, offsets, np.asarray(lengths), block_tokens)


def test_equal_hash_ids_give_equal_blocks_and_different_ids_different_blocks():
    space = TokenSpace(0)
    a, b, c = blocks_of(space, [[7, 8, 9], [7, 8, 10], [11, 8, 9]], [48, 48, 48], 16)
    assert np.array_equal(a[:32], b[:32])  # hash 7, 8 shared
    assert not np.intersect1d(a[32:], b[32:]).size  # 9 vs 10: disjoint ids
    assert not np.intersect1d(a[:16], c[:16]).size  # 7 vs 11
    assert np.array_equal(a[16:], c[16:])  # same hash at the same position -> same block
    for prompt in (a, b, c):
        assert len(np.unique(prompt)) == len(prompt)  # no id repeats inside a prompt
        assert not prompt.flags.writeable and prompt.dtype == np.int32


def test_a_partial_last_block_is_a_prefix_of_the_full_block():
    space = TokenSpace(0)
    full, partial = blocks_of(space, [[1, 2], [1, 2]], [1024, 600], 512)
    assert len(partial) == 600 and np.array_equal(partial, full[:600])


def test_hash_derived_ids_never_equal_fresh_ids():
    space = TokenSpace(5)
    hashed = np.concatenate(blocks_of(space, [list(range(200))], [200 * 512], 512))
    fresh = space.fresh(200 * 512)
    assert hashed.max() < UNIQUE_BASE <= fresh.min()


def test_hash_ids_out_of_range_are_input_errors():
    from harness.errors import InputError

    with pytest.raises(InputError, match="hash ids must lie"):
        blocks_of(TokenSpace(0), [[1 << 25]], [10], 512)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=6), min_size=2, max_size=6),
       st.sampled_from([1, 3, 16, 512]))
def test_block_equality_mirrors_hash_equality(hash_lists, block_tokens):
    lengths = [len(h) * block_tokens for h in hash_lists]
    prompts = blocks_of(TokenSpace(9), hash_lists, lengths, block_tokens)
    seen: dict[int, np.ndarray] = {}
    for hashes, prompt in zip(hash_lists, prompts):
        for i, h in enumerate(hashes):
            block = prompt[i * block_tokens:(i + 1) * block_tokens]
            for other, other_block in seen.items():
                if other == h:
                    assert np.array_equal(block, other_block)
                else:
                    assert not np.intersect1d(block, other_block).size
            seen[h] = block
