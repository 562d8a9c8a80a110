"""Token ids for prompts: shared where prompts share, distinct everywhere else.

Every prompt token id comes from one ``TokenSpace`` per built workload. Ids are
a keyed bijection of a counter over a 30-bit space, so:

- ``fresh(n)`` gives ids no other call of the same space ever gives (unique
  tokens: a counter that only moves forward, in its own half of the space);
- ``from_hash_blocks`` maps (hash id, position in block) to an id, so equal hash
  ids give equal token blocks and different hash ids give disjoint ones
  (Mooncake ``hash_ids``);
- a shared prefix is simply the same array reused (docqa's system prompt).

NOTE: ids lie in [0, 2**30): the engine's synthetic generated tokens live at
2**30 and above (``harness.engine.sequence.SYNTHETIC_TOKEN_BASE``). The ids look
random (the bijection mixes the counter), so an executor that needs ids below a
model's vocabulary size can take ``id % vocab_size`` without lining up unrelated
prompts. All work is vectorised: no Python object per token.
"""

from __future__ import annotations

import numpy as np

from harness.errors import ConfigError, InputError

ID_BITS = 30
ID_SPACE = 1 << ID_BITS  # every prompt id is < ID_SPACE
HASH_SPACE = 1 << 28  # counters [0, HASH_SPACE) for hash-derived blocks
_MASK = np.uint32(ID_SPACE - 1)
_MULTIPLIERS = (np.uint32(0x2C1B3C6D), np.uint32(0x297A2D39), np.uint32(0x9E3779B1))  # odd
_CHUNK_TOKENS = 1 << 22  # bounds temporary memory when materialising big traces


def readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


class TokenSpace:
    """The id source of one workload build (shared by a mixture's components)."""

    def __init__(self, seed: int) -> None:
        state = np.random.SeedSequence([int(seed), 0x7043]).generate_state(2)
        self._keys = tuple(np.uint32(int(k) & (ID_SPACE - 1)) for k in state)
        self._next_unique = HASH_SPACE
        self.hash_user: str | None = None  # which component derives ids from hashes

    # -- the bijection --------------------------------------------------------------

    def _permute(self, counters: np.ndarray) -> np.ndarray:
        """Map uint32 counters in [0, ID_SPACE) to ids, in place; bijective on the space."""
        x = counters
        k0, k1 = self._keys
        a, b, c = _MULTIPLIERS
        x += k0
        x &= _MASK
        x *= a
        x &= _MASK
        x ^= x >> np.uint32(15)
        x += k1
        x &= _MASK
        x *= b
        x &= _MASK
        x ^= x >> np.uint32(13)
        x *= c
        x &= _MASK
        x ^= x >> np.uint32(16)
        return x

    # -- unique ids -----------------------------------------------------------------

    def fresh(self, n: int) -> np.ndarray:
        """``n`` ids never handed out before by this space: a read-only [n] int32 array."""
        return self.fresh_many(np.array([n]))[0]

    def fresh_many(self, lengths: np.ndarray) -> list[np.ndarray]:
        """One read-only int32 array of fresh ids per length (views of one buffer)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        total = int(lengths.sum())
        start = self._next_unique
        if start + total > ID_SPACE:
            raise ConfigError(
                f"workload needs {total:,} more unique token ids than the {ID_SPACE - HASH_SPACE:,} "
                "available; reduce workload.num_requests or use a time window")
        self._next_unique += total
        buffer = np.empty(total, dtype=np.int32)
        for lo in range(0, total, _CHUNK_TOKENS):
            hi = min(lo + _CHUNK_TOKENS, total)
            counters = np.arange(start + lo, start + hi, dtype=np.uint32)
            buffer[lo:hi] = self._permute(counters).view(np.int32)
        return _split(readonly(buffer), lengths)

    # -- hash-derived ids ------------------------------------------------------------

    def claim_hashes(self, owner: str) -> None:
        """Reserve the hash namespace for one component: two traces' hash ids are unrelated."""
        if self.hash_user is not None and self.hash_user != owner:
            raise ConfigError(
                f"{owner}: only one component of a mixture may derive tokens from hash ids "
                f"({self.hash_user} already does); their hash ids would alias")
        self.hash_user = owner

    def from_hash_blocks(self, hash_ids: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                         block_tokens: int, *, path: str | None = None) -> list[np.ndarray]:
        """Prompts whose i-th block of ``block_tokens`` tokens is derived from hash id i.

        ``hash_ids[offsets[r]:offsets[r+1]]`` are request r's block hashes (CSR layout);
        request r's prompt is ``lengths[r]`` tokens and uses its first
        ceil(lengths[r] / block_tokens) hashes. Equal hash ids give equal blocks (a
        partial last block is a prefix of the full block); different ids give
        disjoint ids. Returns read-only int32 views of one buffer.
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
        # Select each request's first blocks_needed hash ids.
        block_first = np.cumsum(blocks_needed) - blocks_needed
        picked = np.repeat(offsets[:-1] - block_first, blocks_needed) + np.arange(int(blocks_needed.sum()))
        block_hash = hash_ids[picked]
        if block_hash.size and (block_hash.min() < 0 or (int(block_hash.max()) + 1) * block_tokens > HASH_SPACE):
            raise InputError(f"hash ids must lie in [0, {HASH_SPACE // block_tokens:,}) for "
                             f"{block_tokens}-token blocks; got {int(block_hash.min())}..{int(block_hash.max())}",
                             path=path, field="hash_ids")
        block_len = np.full(block_hash.size, block_tokens, dtype=np.int64)
        last = np.cumsum(blocks_needed) - 1
        block_len[last] = lengths - (blocks_needed - 1) * block_tokens
        block_end = np.cumsum(block_len)
        block_start = block_end - block_len
        # NOTE: token at buffer position p inside block b has counter
        # hash[b] * block_tokens + (p - block_start[b]).
        base = block_hash * block_tokens - block_start
        total = int(lengths.sum())
        buffer = np.empty(total, dtype=np.int32)
        b0 = 0
        while b0 < block_hash.size:
            b1 = int(np.searchsorted(block_end, block_start[b0] + _CHUNK_TOKENS, side="right"))
            b1 = max(b1, b0 + 1)
            lo, hi = int(block_start[b0]), int(block_end[b1 - 1])
            counters = np.repeat(base[b0:b1], block_len[b0:b1]) + np.arange(lo, hi)
            buffer[lo:hi] = self._permute(counters.astype(np.uint32)).view(np.int32)
            b0 = b1
        return _split(readonly(buffer), lengths)


def _split(buffer: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    ends = np.cumsum(lengths)
    starts = ends - lengths
    return [buffer[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
