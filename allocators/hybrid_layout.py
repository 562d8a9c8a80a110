"""The hybrid KV manager's KV cache groups: their unified pages, the accounting unit, and
the prefix cache they share (the prefix every group can serve).

Modelled on vLLM v1's ``_get_kv_cache_groups_uniform_page_size`` (kv_cache_utils.py) and
its rule for mamba hybrids (the attention block size is raised so a page holds the state):

- Group size ``G``: the fewest layers of any kind, or the most when every kind has fewer
  than 1.25 times the fewest (vLLM's rule). Each kind's layers are cut into KV cache
  groups of ``G`` layers; the last group of a kind may be short (its missing layers are
  padding: the page is sized for ``G``).
- One physical block of the shared pool is one page: ``G`` layer pages of ``p`` bytes.
  Attention layers keep ``tokens_per_block`` tokens in a layer page: the configured
  ``block_size`` for the kind with the most bytes a token and layer, raised to the
  smallest multiple of ``block_size`` whose layer page holds a linear layer's recurrent
  state when the model has linear layers; a kind with fewer bytes a token keeps
  ``floor(p / its bytes)`` tokens. A linear layer's state fills part of its layer page.
- The pool is the whole pages that fit in the bytes ``paged`` is given; what is left
  (less than a page) is outside it, as ``paged`` leaves ``capacity mod block_size`` slots.
- The accounting unit (``unit_bytes``, results.json's ``slot_bytes``) is the gcd of the
  page and of every group's bytes a token (attention) or state (linear), so that every
  category is a whole number of units; for a uniform model it is ``bytes_per_slot``.

Kinds of the same spec (every group of one kind has the same tokens per block and
window) move in lockstep, so the manager keeps one ``KindLayout`` per kind.

The common prefix hit (``common_hit``) is vLLM's ``HybridKVCacheCoordinator.
find_longest_cache_hit``: each attention kind answers the longest hit up to the current
length (``kind_hit``), repeated until no kind shortens it. A full or MLA kind needs every
block of the prefix cached; a sliding kind only the ``ceil((W - 1) / b)`` blocks before the
hit's end, the keys the next query reads (vLLM's right-to-left scan in
``SlidingWindowManager.find_longest_cache_hit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import and_
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from pagebench.allocators.block_pool import BlockPool
from pagebench.allocators.prefix_keys import MASK, MUL, PromptKeys, chain_keys


class LayerGroup(Protocol):
    """What the layout reads of a model's layer group (``harness.models.model_layers.LayerGroup``
    has these; the allocators import nothing of the harness but its shared modules)."""

    kind: str  # full | mla | sliding | linear
    num_layers: int
    bytes_per_token: int  # all of the group's layers; 0 for linear layers
    state_bytes: int  # linear layers: a sequence's recurrent state
    window: int | None  # sliding layers: the tokens a query sees


GROUP_SIZE_RATIO = 1.25  # vLLM: use the most layers when every kind is within this ratio


class LayoutError(ValueError):
    """A model or block size the hybrid pages cannot serve; ``key`` is the catalog key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key = key


@dataclass(frozen=True)
class KindLayout:
    """The KV cache groups of one layer kind and how their pages are filled.

    ``group_layers``: the real layers of each of its KV cache groups (``G`` each, the last
    maybe fewer); ``group_ids``: their indices among all KV cache groups (prefix-cache keys
    carry them, as vLLM's ``BlockHashWithGroupId``); ``layer_bytes``: bytes a token and
    layer (attention) or a sequence's state a layer (linear); ``tokens_per_block``: None
    for linear groups.
    """

    kind: str
    group_layers: tuple[int, ...]
    group_ids: tuple[int, ...]
    layer_bytes: int
    tokens_per_block: int | None
    window: int | None

    @property
    def num_groups(self) -> int:
        return len(self.group_layers)

    @property
    def content_bytes(self) -> int:
        """Bytes of one token (attention) or of the state (linear) over all its groups."""
        return self.layer_bytes * sum(self.group_layers)

    def first_live(self, computed: int) -> int:
        """The first block a query at position ``computed`` may read: a sliding kind's query
        sees ``computed - W + 1 .. computed`` (vLLM's ``get_num_skipped_tokens``), so the
        blocks wholly before it are dead; 0 for every other kind."""
        if self.kind != "sliding":
            return 0
        return max(0, computed - self.window + 1) // self.tokens_per_block

    def peak_blocks(self, prompt_len: int, final_len: int) -> int:
        """The most blocks (per KV cache group) one sequence holds at any step: a linear
        group one state page; a sliding group at most its prompt's blocks (prefilled in
        one step) or the W - 1 older tokens a decode step sees and its own, whichever is
        more, and never more than a full group."""
        if self.tokens_per_block is None:
            return 1
        t = self.tokens_per_block
        every = -(-final_len // t)
        if self.kind != "sliding":
            return every
        return min(every, max(-(-prompt_len // t), -(-(self.window - 1) // t) + 1))


@dataclass(frozen=True)
class HybridLayout:
    """The unified pages of a model (see the module docstring)."""

    group_size: int
    block_size: int  # the configured block size
    attention_block_size: int  # tokens a layer page of the kind with the most bytes holds
    layer_page_bytes: int
    page_bytes: int  # one physical block: group_size layer pages
    num_pages: int
    unit_bytes: int
    kinds: tuple[KindLayout, ...]

    def units(self, num_bytes: int) -> int:
        """``num_bytes`` in accounting units (always a whole number of them)."""
        return num_bytes // self.unit_bytes

    @property
    def page_units(self) -> int:
        return self.page_bytes // self.unit_bytes

    def padding_units(self, kind: KindLayout) -> int:
        """Units of one block of every group of ``kind`` that hold nothing: padding layers,
        the state's unused rest, the tokens-per-block floor."""
        filled = kind.content_bytes * (kind.tokens_per_block or 1)
        return (kind.num_groups * self.page_bytes - filled) // self.unit_bytes


def group_size(layers_per_kind: Sequence[int]) -> int:
    """vLLM's group size: the fewest layers of a kind, or the most when all are close."""
    fewest, most = min(layers_per_kind), max(layers_per_kind)
    return most if most < fewest * GROUP_SIZE_RATIO else fewest


def build_layout(groups: Sequence[LayerGroup], block_size: int, pool_bytes: int,
                 max_context: int) -> HybridLayout:
    """The pages of a model with these layer groups (``ModelSpec.layer_groups``) in a pool
    of ``pool_bytes``. Raises ``LayoutError`` when they cannot be unified."""
    attention = [g for g in groups if g.kind != "linear"]
    if not attention:
        raise LayoutError("kind", "paged_hybrid sizes its pages by attention blocks: the model "
                                  "has only linear layers (model.layer_pattern); use paged")
    size = group_size([g.num_layers for g in groups])
    per_layer = {g.kind: (g.state_bytes if g.kind == "linear" else g.bytes_per_token) // g.num_layers
                 for g in groups}
    widest = max(per_layer[g.kind] for g in attention)
    tokens = block_size
    linear = [g for g in groups if g.kind == "linear"]
    if linear:  # NOTE: vLLM raises the attention block size until a layer page holds the state
        state = per_layer["linear"]
        tokens = block_size * -(-state // (widest * block_size))
        if tokens > max_context:
            raise LayoutError("block_size", f"a linear layer's state ({state:,} bytes) needs "
                              f"attention blocks of {tokens:,} tokens, more than the model's "
                              f"context ({max_context:,}); paged_hybrid cannot unify its pages")
    layer_page = widest * tokens
    kinds, next_id = [], 0
    for g in groups:
        counts = [size] * (g.num_layers // size) + ([g.num_layers % size] if g.num_layers % size else [])
        ids = tuple(range(next_id, next_id + len(counts)))
        next_id += len(counts)
        per_block = None if g.kind == "linear" else layer_page // per_layer[g.kind]
        kinds.append(KindLayout(g.kind, tuple(counts), ids, per_layer[g.kind], per_block, g.window))
    page = size * layer_page
    unit = math.gcd(page, *(k.layer_bytes * n for k in kinds for n in k.group_layers),
                    *(k.content_bytes for k in kinds))
    return HybridLayout(size, block_size, tokens, layer_page, page, pool_bytes // page, unit,
                        tuple(kinds))


# From this many keys on, ``GroupPrefixCache.salted`` computes in numpy (uint64 wraps mod 2**64,
# which is MASK)
SALT_VECTOR_MIN = 32

# Blocks whose cached flags are looked up at once (one salted-key list per group); a full
# kind's scan reads at most one chunk past its first miss.
FLAG_CHUNK = 64


def kind_hit(kind: KindLayout, limit: int, flags: Callable[[int, int], list[bool]]) -> int:
    """The longest prompt prefix of at most ``limit`` tokens this attention kind serves;
    ``flags(lo, hi)``: whether each of blocks ``lo .. hi - 1`` is cached in every group
    of the kind (asked for in chunks: one call per ``FLAG_CHUNK`` blocks, not per block)."""
    t = kind.tokens_per_block
    blocks = limit // t
    if kind.kind != "sliding":
        for lo in range(0, blocks, FLAG_CHUNK):
            chunk = flags(lo, min(lo + FLAG_CHUNK, blocks))
            if False in chunk:
                return (lo + chunk.index(False)) * t
        return blocks * t
    need = -(-(kind.window - 1) // t)  # blocks of the W - 1 keys the next query reads
    run = 0
    for hi in range(blocks, 0, -FLAG_CHUNK):  # right to left
        lo = max(hi - FLAG_CHUNK, 0)
        chunk = flags(lo, hi)
        for j in range(hi - 1, lo - 1, -1):
            if not chunk[j - lo]:
                run = 0
                continue
            run += 1
            if run >= need:
                return (j + need) * t
    return (run if need else blocks) * t  # a prefix shorter than the window: all its blocks


def common_hit(kinds: Sequence[KindLayout], limit: int,
               flags: Callable[[int, int, int], list[bool]]) -> int:
    """The longest prefix of at most ``limit`` tokens every attention kind serves;
    ``flags(i, lo, hi)``: whether each of blocks ``lo .. hi - 1`` of kind ``i`` is cached
    in every group of it."""
    hit = limit
    while True:
        before = hit
        for i, kind in enumerate(kinds):
            if kind.tokens_per_block is not None:
                hit = kind_hit(kind, hit, lambda lo, hi, i=i: flags(i, lo, hi))
        if hit == before:
            return hit


class _HitMemo:
    """The last prompt's common hit, the blocks it holds, and what keeps them valid."""

    __slots__ = ("data", "hit", "blocks", "held", "chains", "evictions")

    def __init__(self, data: bytes, hit: int, blocks: dict[int, list[list[int]]],
                 chains: dict[int, set[int]], evictions: int) -> None:
        self.data, self.hit, self.blocks = data, hit, blocks
        # NOTE: only evicting one of these (or registering a key of a chain) can change the
        # hit: every kind's hit at ``hit`` reads exactly these blocks, and ``common_hit``
        # is the greatest prefix that all kinds serve, which fewer cached blocks elsewhere
        # cannot raise (kind_hit is monotone in the cached blocks and in its limit)
        self.held = {b for tables in blocks.values() for table in tables for b in table}
        self.chains = chains  # attention kind -> the prompt's chain keys (its blocks' keys)
        self.evictions = evictions  # the pool's num_evictions when last checked


class GroupPrefixCache:
    """The KV cache groups' prefix cache over one ``BlockPool``: keys salted per group, the
    common hit (memoised until a block of the hit is evicted or a block gets a key of the
    prompt), and registration in every group of a kind or in none (a key some group still
    holds stays that block's), so a hit's blocks across a kind's groups share their ref
    counts."""

    def __init__(self, pool: BlockPool, kinds: Sequence[KindLayout], enabled: bool) -> None:
        self.pool, self.kinds, self.enabled = pool, kinds, enabled
        self._attention = [i for i, k in enumerate(kinds) if k.tokens_per_block is not None]
        self._memo: _HitMemo | None = None
        self._prompts: dict[int, PromptKeys] = {}  # tokens per block -> the last prompt's chain

    def prompt_keys(self, data: bytes, tokens_per_block: int) -> PromptKeys:
        prompt = self._prompts.get(tokens_per_block)
        if prompt is None or prompt.data != data:
            prompt = self._prompts[tokens_per_block] = PromptKeys(data, 4 * tokens_per_block)
        return prompt

    def salted(self, kind_index: int, keys: list[int]) -> list[list[int]]:
        """Per group of the kind: the chain keys salted with its id, a block's cache key in
        that KV cache group (``(key * MUL + group_id + 1) & MASK``, a list per group)."""
        return list(self._salted_each(kind_index, keys))

    def _salted_each(self, kind_index: int, keys: list[int]) -> Iterator[list[int]]:
        """``salted``, one group at a time."""
        salts = [g + 1 for g in self.kinds[kind_index].group_ids]
        if len(keys) < SALT_VECTOR_MIN:
            return ([(key * MUL + salt) & MASK for key in keys] for salt in salts)
        mixed = np.array(keys, dtype=np.uint64) * np.uint64(MUL)  # [len(keys)]: wraps mod 2**64
        return ((mixed + np.uint64(salt)).tolist() for salt in salts)

    def hit_blocks(self, kind_index: int, keys: list[int]) -> list[list[int]]:
        """Per group of the kind, the blocks of these chain keys (a hit's: cached in all)."""
        return list(map(self.pool.lookup_many, self.salted(kind_index, keys)))

    def cached_flags(self, kind_index: int, keys: list[int]) -> list[bool]:
        """For each chain key: is its block cached in every group of the kind?"""
        lookup, flags = self.pool.lookup_many, None
        for salted in self._salted_each(kind_index, keys):
            found = [b is not None for b in lookup(salted)]
            flags = found if flags is None else list(map(and_, flags, found))
            if True not in flags:
                break  # none is cached in every group (often none in any: the others unread)
        return flags

    def hit_tokens(self, data: bytes) -> int:
        """The longest prompt prefix every group serves (at most len - 1 tokens)."""
        return self.hit(data)[0]

    def hit(self, data: bytes) -> tuple[int, dict[int, list[list[int]]]]:
        """``(hit tokens, blocks)``: the longest prompt prefix every group serves (at most
        len - 1 tokens) and, per attention kind, each group's blocks of it from the first
        the next query reads (``first_live``) on (read only). Memoised (``_HitMemo``)."""
        if not self.enabled:
            return 0, {}
        memo = self._memo
        if memo is not None and memo.data == data:
            evictions = self.pool.num_evictions
            evicted = self.pool.evicted_since(memo.evictions)
            if evicted is not None and memo.held.isdisjoint(evicted):
                memo.evictions = evictions
                return memo.hit, memo.blocks
        limit = len(data) // 4 - 1
        keys = {i: self.prompt_keys(data, self.kinds[i].tokens_per_block).keys(
            0, limit // self.kinds[i].tokens_per_block) for i in self._attention}
        hit = common_hit(self.kinds, limit, lambda i, lo, hi: self.cached_flags(i, keys[i][lo:hi]))
        blocks = {}
        for i in self._attention:
            kind = self.kinds[i]
            blocks[i] = self.hit_blocks(i, keys[i][kind.first_live(hit):hit // kind.tokens_per_block])
        self._memo = _HitMemo(data, hit, blocks, {i: set(chain) for i, chain in keys.items()},
                              self.pool.num_evictions)
        return hit, blocks

    def register(self, tables: Sequence, tokens: Sequence[int], upto: int) -> None:
        """Key and register the blocks ``upto`` tokens fill in each attention kind's groups;
        ``tables[i]``: the sequence's tables of kind ``i`` (``tables``, ``first``, ``keyed``,
        ``last_key``, updated), ``tokens``: its tokens (an ``array("i")``)."""
        for i in self._attention:
            k, kt = self.kinds[i], tables[i]
            t = k.tokens_per_block
            count = upto // t - kt.keyed
            if count <= 0:
                continue
            keys = chain_keys(kt.last_key, tokens[kt.keyed * t:(kt.keyed + count) * t].tobytes(),
                              0, count, 4 * t)
            start = kt.keyed - kt.first
            salted = self.salted(i, keys)
            free = None  # each key's block is registered in every group (or in none, ``free``)
            if len(salted) > 1:
                found = list(map(self.pool.lookup_many, salted))  # [groups][count]
                if any(blocks.count(None) != count for blocks in found):  # a group holds some
                    free = [all(b is None for b in column) for column in zip(*found)]
            for g_keys, table in zip(salted, kt.tables):
                blocks = table[start:start + count]
                if free is not None:
                    blocks = [b for b, ok in zip(blocks, free) if ok]
                    g_keys = [key for key, ok in zip(g_keys, free) if ok]
                self.pool.register_many(blocks, g_keys)
            kt.keyed, kt.last_key = kt.keyed + count, keys[-1]
            if self._memo is not None and not self._memo.chains[i].isdisjoint(keys):
                self._memo = None  # the prompt's hit may grow
