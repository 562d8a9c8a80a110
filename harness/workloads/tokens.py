"""Token ids for prompts: shared where prompts share, distinct everywhere else.

Every prompt token id comes from one ``TokenSpace`` per built workload:

- ``fresh(n)`` gives ids no other call of the same space ever gives: a counter
  that only moves forward, through a keyed bijection of [0, 2**29), placed in
  [2**29, 2**30);
- ``from_hash_blocks`` maps (hash id, position in block) to an id in
  [0, 2**29), so equal hash ids give equal token blocks and different hash ids
  give disjoint ones (Mooncake ``hash_ids``);
- a shared prefix is simply the same array reused (docqa's system prompt).

NOTE: ids lie in [0, 2**30); the engine's synthetic generated tokens live at
2**30 and above (``harness.engine.sequence.SYNTHETIC_TOKEN_BASE``). Ids look
random (keyed by the seed), so an executor that needs ids below a model's
vocabulary size can take ``id % vocab_size`` without lining up unrelated
prompts. All work is vectorised: no Python object per token.
"""

from __future__ import annotations

import numpy as np

from harness.errors import ConfigError, InputError

ID_BITS = 30
ID_SPACE = 1 << ID_BITS  # every prompt id is < ID_SPACE
UNIQUE_BASE = 1 << 29  # fresh ids: [UNIQUE_BASE, ID_SPACE); hash-derived ids: [0, UNIQUE_BASE)
_UNIQUE_BITS = 29
_MULTIPLIERS = (0x2C1B3C6D, 0x297A2D39, 0x9E3779B1)  # odd
# fresh ids are generated this many at a time: bounds temporary memory, and keeps each
# chunk's ten in-place passes in the CPU's L2 cache (16M ids: 0.093 s with chunks of 1 << 22,
# 0.042 s with 1 << 16; best of 3 on this project's 2-vCPU EPYC VM, 2026-12-05)
_CHUNK_TOKENS = 1 << 16


def readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _permute(x: np.ndarray, bits: int, keys: tuple[int, int]) -> np.ndarray:
    """A keyed bijection of [0, 2**bits) applied in place to uint32 ``x`` (add, odd multiply, xorshift)."""
    mask = np.uint32((1 << bits) - 1)
    shifts = (np.uint32(max(1, (bits + 1) // 2)), np.uint32(max(1, bits // 3 + 1)))
    k0, k1 = (np.uint32(k & ((1 << bits) - 1)) for k in keys)
    a, b, c = (np.uint32(m) for m in _MULTIPLIERS)
    for key, mult, shift in ((k0, a, shifts[0]), (k1, b, shifts[1]), (None, c, shifts[0])):
        if key is not None:
            x += key
            x &= mask
        x *= mult
        x &= mask
        x ^= x >> shift
    return x


class TokenSpace:
    """The id source of one workload build (shared by a mixture's components)."""

    def __init__(self, seed: int) -> None:
        self._seed = int(seed)
        state = np.random.SeedSequence([self._seed, 0x7043]).generate_state(4)
        self._unique_keys = (int(state[0]), int(state[1]))
        self._hash_keys = (int(state[2]), int(state[3]))
        self._next_unique = 0
        self.hash_user: str | None = None  # which component derives ids from hashes

    # -- unique ids -----------------------------------------------------------------

    def fresh(self, n: int) -> np.ndarray:
        """``n`` ids never handed out before by this space: a read-only [n] int32 array."""
        return self.fresh_many(np.array([n]))[0]

    def fresh_many(self, lengths: np.ndarray) -> list[np.ndarray]:
        """One read-only int32 array of fresh ids per length (views of one buffer)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        total = int(lengths.sum())
        start = self._next_unique
        if start + total > (1 << _UNIQUE_BITS):
            raise ConfigError(
                f"workload needs {total:,} more unique token ids than the {(1 << _UNIQUE_BITS) - start:,} "
                "left; reduce workload.num_requests or use a time window")
        self._next_unique += total
        buffer = np.empty(total, dtype=np.int32)
        for lo in range(0, total, _CHUNK_TOKENS):
            hi = min(lo + _CHUNK_TOKENS, total)
            ids = _permute(np.arange(start + lo, start + hi, dtype=np.uint32), _UNIQUE_BITS, self._unique_keys)
            ids |= np.uint32(UNIQUE_BASE)
            buffer[lo:hi] = ids.view(np.int32)
        return _split(readonly(buffer), lengths)

    # -- hash-derived ids ------------------------------------------------------------

    def claim_hashes(self, owner: str) -> None:
        """Reserve the hash namespace for one component: two traces' hash ids are unrelated."""
        if self.hash_user is not None and self.hash_user != owner:
            raise ConfigError(
                f"{owner}: only one component of a mixture may derive tokens from hash ids "
                f"({self.hash_user} already does); their hash ids would alias")
        self.hash_user = owner

    def _position_ids(self, block_tokens: int) -> tuple[np.ndarray, int]:
        """[block_tokens] uint32 per-position pattern and the number of low bits it owns.

        NOTE: the low ``pos_bits`` of the pattern are a bijection of the position, so two
        positions never share an id; the high bits are random, so blocks look unrelated.
        """
        pos_bits = max(1, (block_tokens - 1).bit_length())
        hash_bits = _UNIQUE_BITS - pos_bits
        rng = np.random.default_rng([self._seed, 0x9051, block_tokens])
        high = rng.integers(0, 1 << hash_bits, size=block_tokens, dtype=np.uint32)
        low = _permute(np.arange(block_tokens, dtype=np.uint32), pos_bits, self._hash_keys)
        return (high << np.uint32(pos_bits)) | low, pos_bits

    def hash_id_limit(self, block_tokens: int) -> int:
        """Hash ids ``from_hash_blocks`` takes lie in [0, this) for blocks of this size."""
        return 1 << (_UNIQUE_BITS - self._position_ids(block_tokens)[1])

    def from_hash_blocks(self, hash_ids: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                         block_tokens: int, *, path: str | None = None) -> list[np.ndarray]:
        """Prompts whose i-th block of ``block_tokens`` tokens is derived from hash id i.

        ``hash_ids[offsets[r]:offsets[r+1]]`` are request r's block hashes (CSR layout);
        request r's prompt is ``lengths[r]`` tokens and uses its first
        ceil(lengths[r] / block_tokens) hashes. Token j of the block of hash h is
        ``(P(h) << pos_bits) ^ pattern[j]`` (P a keyed bijection): equal hash ids give
        equal blocks (a partial last block is a prefix of the full block), different
        ids give disjoint ids, and no id equals a ``fresh`` one. Returns read-only
        int32 views into one [blocks, block_tokens] buffer: one pass, no per-token Python.
        """
        hash_ids = np.asarray(hash_ids, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        blocks_needed = -(-lengths // block_tokens)
        available = np.diff(offsets)
        if np.any(blocks_needed > available):
            r = int(np.argmax(blocks_needed > available))
            raise InputError(f"request {r} has {lengths[r]} tokens but only {available[r]} hash ids "
                             f"of {block_tokens} tokens", path=path, field="hash_ids")
        block_first = np.cumsum(blocks_needed) - blocks_needed  # first block row of each request
        picked = np.repeat(offsets[:-1] - block_first, blocks_needed) + np.arange(int(blocks_needed.sum()))
        block_hash = hash_ids[picked]
        pattern, pos_bits = self._position_ids(block_tokens)
        hash_bits = _UNIQUE_BITS - pos_bits
        if block_hash.size and (block_hash.min() < 0 or block_hash.max() >= (1 << hash_bits)):
            raise InputError(f"hash ids must lie in [0, {1 << hash_bits:,}) for {block_tokens}-token "
                             f"blocks; got {int(block_hash.min())}..{int(block_hash.max())}",
                             path=path, field="hash_ids")
        high = _permute(block_hash.astype(np.uint32), hash_bits, self._hash_keys) << np.uint32(pos_bits)
        blocks = np.empty((block_hash.size, block_tokens), dtype=np.int32)  # [blocks, block_tokens]
        np.bitwise_xor(high[:, None], pattern[None, :], out=blocks.view(np.uint32))
        readonly(blocks)
        return [blocks[b:b + n].reshape(-1)[:length] for b, n, length in
                zip(block_first.tolist(), blocks_needed.tolist(), lengths.tolist())]


def _split(buffer: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    ends = np.cumsum(lengths)
    starts = ends - lengths
    return [buffer[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
