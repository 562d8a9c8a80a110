"""The hybrid KV manager: one block table per KV cache group over one shared pool
(vLLM v1's ``HybridKVCacheManager`` / ``HybridKVCacheCoordinator``).

The layer groups of the model (full, MLA, sliding window, linear) are cut into KV cache
groups of equal layer count whose pages all have one size (``allocators.hybrid_layout``).
Every KV cache group keeps its own block table per sequence and allocates from the one
``BlockPool``; the groups of one kind move in lockstep (the same number of blocks at the
same moments), so the manager keeps them together, as vLLM's coordinator does per spec.

- Full and MLA groups hold every block of the sequence, as ``paged`` does.
- Sliding-window groups free the blocks no query can see any more, by vLLM's
  ``SlidingWindowManager.remove_skipped_blocks``: before tokens are appended to a
  sequence that has ``n`` tokens, the next query (position ``n``) sees positions
  ``n - W + 1 .. n``, so the blocks wholly before ``n - W + 1`` (the first
  ``max(0, n - W + 1) // tokens_per_block``) go back to the free list, newest first,
  still cached and evictable. So a decode step holds at most ``ceil((W - 1) / b) + 1``
  blocks a group; a prefill chunk of ``k`` tokens the blocks of ``W + k - 1`` tokens.
- A linear group holds exactly one page per sequence: its recurrent state.

Prefix caching (per KV cache group, keys salted with the group id as vLLM's
``BlockHashWithGroupId``): a prompt hits the longest prefix every group can serve,
found as ``HybridKVCacheCoordinator.find_longest_cache_hit`` does: each kind answers
the longest hit up to the current length, repeated until no kind shortens it. A full
group needs all the prefix's blocks cached; a sliding group only the
``ceil((W - 1) / b)`` blocks before the hit's end (vLLM's right-to-left scan), and holds
only those. A model with a linear group serves no prefix hits (the recurrent state
after a prefix is not kept; vLLM caches it only in its experimental ``align`` mode).

Not offered: swap (``swap_out`` returns None, so the scheduler recomputes), a torch
layout (``tensor_layout = "none"``: engine=sim only) and fast-forward's closed form
(``bulk_decode`` None: the engine steps it one step at a time). A fork shares the
attention blocks and copies each linear group's state page.
"""

from __future__ import annotations

from array import array
from typing import Sequence

from allocators.accounting import PartialBlockLedger, make_breakdown
from allocators.base import Admission, Capabilities, ManagerStats, MemoryBreakdown, register_manager
from allocators.block_pool import BlockPool, gather
from allocators.hybrid_layout import HybridLayout, LayoutError, build_layout
from allocators.prefix_keys import MASK, MUL, PromptKeys, chain_keys, extend_tokens, token_bytes
from harness.errors import ConfigError


def group_key(key: int, group_id: int) -> int:
    """A block's cache key in one KV cache group (the chain key salted with the group)."""
    return (key * MUL + group_id + 1) & MASK


class _Tables:
    """A sequence's block tables in the groups of one kind (lockstep: equal lengths)."""

    __slots__ = ("tables", "first", "keyed", "last_key")

    def __init__(self, tables: list[list[int]], first: int, keyed: int, last_key: int) -> None:
        self.tables = tables  # per KV cache group: its live blocks, in position order
        self.first = first  # index of tables[g][0] among the sequence's blocks (window-freed before)
        self.keyed = keyed  # full blocks registered in the prefix cache
        self.last_key = last_key  # chain key of the last of them (0: none)


class _Seq:
    __slots__ = ("num_tokens", "final_len", "kinds", "tokens")

    def __init__(self, num_tokens: int, final_len: int, kinds: list[_Tables], tokens: array) -> None:
        self.num_tokens, self.final_len, self.kinds, self.tokens = num_tokens, final_len, kinds, tokens


@register_manager("paged_hybrid")
class HybridKVCacheManager:
    """Per-group block tables over one ``BlockPool`` of unified pages (module docstring)."""

    options: tuple[str, ...] = ()
    uses_block_size = True
    tensor_layout = "none"  # no torch layout: engine=sim only

    @classmethod
    def from_system(cls, system, capacity_slots: int, cpu_slots: int, max_model_len: int,
                    model) -> "HybridKVCacheManager":
        """The catalog entry ``kind: paged_hybrid``: pages over the bytes ``paged`` gets."""
        pool_bytes = capacity_slots * model.bytes_per_slot
        try:
            layout = build_layout(model.layer_groups, system.block_size, pool_bytes, model.max_context)
        except LayoutError as error:
            raise ConfigError(f"allocator.{system.name}.{error.key}: {error}") from None
        if layout.num_pages < 1:
            raise ConfigError(f"allocator.{system.name}.block_size: a page of {layout.page_bytes:,} "
                              f"bytes is larger than the whole KV pool ({pool_bytes:,} bytes)")
        return cls(layout, enable_prefix_caching=system.prefix_caching, name=system.name)

    @staticmethod
    def system_problem(system, model) -> tuple[str, str] | None:
        if model is None or system.block_size is None:
            return None
        try:
            build_layout(model.layer_groups, system.block_size, 0, model.max_context)
        except LayoutError as error:
            return error.key, str(error)
        return None

    @staticmethod
    def label(system) -> str:
        return f"paged hybrid (block {system.block_size}{', prefix cache' if system.prefix_caching else ''})"

    @staticmethod
    def kernel_layout(system) -> tuple[str, int | None]:
        """Block tables of block_size tokens (a linear model's raised block is not priced)."""
        return "paged", system.block_size

    def __init__(self, layout: HybridLayout, *, enable_prefix_caching: bool = True,
                 name: str = "paged_hybrid") -> None:
        kinds = layout.kinds
        self.name, self.layout, self.block_size = name, layout, layout.block_size
        self.num_blocks = layout.num_pages
        self.capacity_slots = layout.num_pages * layout.page_units
        self.slot_bytes = layout.unit_bytes
        self.pool = BlockPool(layout.num_pages)
        self.enable_prefix_caching = bool(enable_prefix_caching) and all(
            k.tokens_per_block is not None for k in kinds)
        self.stats = ManagerStats()
        self.capabilities = Capabilities(layout=self.tensor_layout, layer_groups=True,
                                         prefix_cache=self.enable_prefix_caching)
        self._attention = [i for i, k in enumerate(kinds) if k.tokens_per_block is not None]
        self._primary = next((i for i in self._attention if kinds[i].kind != "sliding"),
                             self._attention[0])  # the kind slot_mapping maps
        self._token_units = [layout.units(k.content_bytes) for k in kinds]
        self._padding_units = [layout.padding_units(k) for k in kinds]
        self._ledgers = [PartialBlockLedger(k.tokens_per_block or 1) for k in kinds]
        self._held = [0] * len(kinds)  # blocks of each group of the kind in use (ref > 0)
        self._peak = [0] * len(kinds)
        self._window_freed = [0] * len(kinds)  # blocks (all groups) freed by the window
        self._hit_blocks = [0] * len(kinds)  # blocks (all groups) reused from the cache
        self._seqs: dict[int, _Seq] = {}
        self._logical = 0
        self._registered = 0  # registrations so far: with num_evictions, the memo's validity
        self._memo: tuple | None = None  # (prompt bytes, pool state, hit tokens)
        self._prompts: dict[int, PromptKeys] = {}  # tokens per block -> the last prompt's chain

    # ---------------------------------------------------------------- queries
    def _get(self, seq_id: int) -> _Seq:
        s = self._seqs.get(seq_id)
        if s is None:
            raise ValueError(f"unknown seq_id {seq_id!r}: admit it (or fork into it) first")
        return s

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def num_tokens(self, seq_id: int) -> int:
        return self._get(seq_id).num_tokens

    def block_tables(self, seq_id: int) -> list[list[int]]:
        """Each KV cache group's live blocks of the sequence, in group id order (copies)."""
        return [list(t) for kt in self._get(seq_id).kinds for t in kt.tables]

    def _first_live(self, kind_index: int, computed: int) -> int:
        """The first block a query at position ``computed`` may still read (sliding only)."""
        k = self.layout.kinds[kind_index]
        return max(0, computed - k.window + 1) // k.tokens_per_block if k.kind == "sliding" else 0

    def _seq_units(self, s: _Seq) -> int:
        """Units the sequence's KV would take if nothing were shared (its logical tokens)."""
        units = 0
        for i, (k, kt) in enumerate(zip(self.layout.kinds, s.kinds)):
            t = k.tokens_per_block
            units += self._token_units[i] * (1 if t is None else s.num_tokens - kt.first * t)
        return units

    def fits_empty_pool(self, prompt_len: int, final_len: int) -> bool:
        return self._peak_pages(prompt_len, final_len) <= self.num_blocks

    def member_slots(self, prompt_len: int, final_len: int) -> int:
        return self._peak_pages(prompt_len, final_len) * self.layout.page_units

    def _peak_pages(self, prompt_len: int, final_len: int) -> int:
        return sum(k.num_groups * k.peak_blocks(prompt_len, final_len) for k in self.layout.kinds)

    def slot_mapping(self, seq_id: int, start: int, end: int) -> list[int]:
        """Each position's unit index in the first group of the primary kind (the first
        full or MLA kind, else sliding): ``block * page_units + offset * token_units``."""
        s = self._get(seq_id)
        k, kt = self.layout.kinds[self._primary], s.kinds[self._primary]
        t = k.tokens_per_block
        if not kt.first * t <= start <= end <= s.num_tokens:
            raise ValueError(f"slot range [{start}, {end}) is outside the live tokens "
                             f"[{kt.first * t}, {s.num_tokens}) of seq {seq_id}")
        page, unit = self.layout.page_units, self.layout.units(k.layer_bytes * k.group_layers[0])
        table = kt.tables[0]
        return [table[p // t - kt.first] * page + p % t * unit for p in range(start, end)]

    # ----------------------------------------------------------- prefix cache
    def _prompt_keys(self, data: bytes, tokens_per_block: int) -> PromptKeys:
        prompt = self._prompts.get(tokens_per_block)
        if prompt is None or prompt.data != data:
            prompt = self._prompts[tokens_per_block] = PromptKeys(data, 4 * tokens_per_block)
        return prompt

    def _cached(self, kind_index: int, key: int) -> list[int] | None:
        """The block of ``key`` in every group of the kind, or None if one lacks it."""
        blocks = self.pool.lookup_many([group_key(key, g) for g in self.layout.kinds[kind_index].group_ids])
        return None if None in blocks else blocks

    def _kind_hit(self, kind_index: int, data: bytes, limit: int) -> int:
        """The longest prefix of at most ``limit`` tokens this kind can serve."""
        k = self.layout.kinds[kind_index]
        t = k.tokens_per_block
        keys = self._prompt_keys(data, t).keys(0, limit // t)
        if k.kind != "sliding":
            for j, key in enumerate(keys):
                if self._cached(kind_index, key) is None:
                    return j * t
            return len(keys) * t
        need = -(-(k.window - 1) // t)  # blocks of the W - 1 tokens the next query reads
        run = 0
        for j in range(len(keys) - 1, -1, -1):  # right to left, as vLLM's sliding window
            if self._cached(kind_index, keys[j]) is None:
                run = 0
                continue
            run += 1
            if run >= need:
                return (j + need) * t
        return (run if need else len(keys)) * t

    def _hit_tokens(self, data: bytes) -> int:
        """The longest prompt prefix every group serves (at most len - 1 tokens)."""
        if not self.enable_prefix_caching:
            return 0
        state = (self.pool.num_evictions, self._registered)
        if self._memo is not None and self._memo[1] == state and self._memo[0] == data:
            return self._memo[2]
        hit = len(data) // 4 - 1
        while True:
            before = hit
            for i in self._attention:
                hit = self._kind_hit(i, data, hit)
            if hit == before:
                break
        self._memo = (data, state, hit)
        return hit

    def cached_prefix_tokens(self, prompt_token_ids: Sequence[int]) -> int:
        return self._hit_tokens(token_bytes(prompt_token_ids))

    def _register(self, s: _Seq, upto: int) -> None:
        """Key and register each attention group's blocks that ``upto`` tokens fill."""
        for i in self._attention:
            k, kt = self.layout.kinds[i], s.kinds[i]
            t = k.tokens_per_block
            count = upto // t - kt.keyed
            if count <= 0:
                continue
            data = s.tokens[kt.keyed * t:(kt.keyed + count) * t].tobytes()
            keys = chain_keys(kt.last_key, data, 0, count, 4 * t)
            start = kt.keyed - kt.first
            for g, table in zip(k.group_ids, kt.tables):
                self.pool.register_many(table[start:start + count], [group_key(key, g) for key in keys])
            kt.keyed, kt.last_key = kt.keyed + count, keys[-1]
            self._registered += count

    # ----------------------------------------------------------- life cycle
    def _admission(self, data: bytes, num_tokens: int) -> tuple:
        """(hit tokens, tokens held, per kind (first, hit blocks per group), new blocks, hit
        blocks that leave the free queue). Changes nothing."""
        hit = self._hit_tokens(data)
        n = max(num_tokens, hit)
        plans, new, taken = [], 0, 0
        ref = self.pool.ref_cnt
        for i, k in enumerate(self.layout.kinds):
            t = k.tokens_per_block
            if t is None:
                plans.append((0, [[] for _ in k.group_ids]))
                new += k.num_groups
                continue
            first = self._first_live(i, hit)
            keys = self._prompt_keys(data, t).keys(first, hit // t) if hit else []
            blocks = list(zip(*map(lambda key: self._cached(i, key), keys))) if keys else []
            blocks = [list(b) for b in blocks] or [[] for _ in k.group_ids]
            taken += sum(gather(ref, b).count(0) for b in blocks)
            plans.append((first, blocks))
            new += k.num_groups * (-(-n // t) - hit // t)
        return hit, n, plans, new, taken

    def can_admit(self, prompt_token_ids: Sequence[int], final_len: int, num_tokens: int) -> bool:
        _, _, _, new, taken = self._admission(token_bytes(prompt_token_ids), num_tokens)
        return new + taken <= self.pool.num_free

    def admit(self, seq_id: int, prompt_token_ids: Sequence[int], final_len: int,
              num_tokens: int) -> Admission | None:
        """Start ``seq_id`` holding its first ``max(num_tokens, cached)`` prompt tokens."""
        prompt_len = len(prompt_token_ids)
        if seq_id in self._seqs:
            raise ValueError(f"seq_id {seq_id!r} is already admitted: free it first or use a new id")
        if not 1 <= num_tokens <= prompt_len <= final_len:
            raise ValueError(f"seq {seq_id}: need 1 <= num_tokens ({num_tokens}) <= prompt length "
                             f"({prompt_len}) <= final_len ({final_len})")
        data = token_bytes(prompt_token_ids)
        hit, n, plans, new, taken = self._admission(data, num_tokens)
        if new + taken > self.pool.num_free:
            return None
        pool, ref = self.pool, self.pool.ref_cnt
        for i, (_, blocks) in enumerate(plans):
            self._took(i, gather(ref, blocks[0]).count(0))
            self._hit_blocks[i] += sum(map(len, blocks))
            for b in blocks:
                pool.touch_many(b)
        kinds = []
        for i, (k, (first, blocks)) in enumerate(zip(self.layout.kinds, plans)):
            t = k.tokens_per_block
            grow = 1 if t is None else -(-n // t) - hit // t
            tables = [b + pool.allocate(grow) for b in blocks]
            self._took(i, grow)
            keyed = hit // t if t else 0
            kinds.append(_Tables(tables, first, keyed,
                                 self._prompt_keys(data, t).keys(keyed - 1, keyed)[0] if keyed else 0))
            if t is not None and n % t:
                self._ledgers[i].add_owner(tables[0][-1], n % t, min(t, final_len - n // t * t))
        s = _Seq(n, final_len, kinds, array("i"))
        self._seqs[seq_id] = s
        if self.enable_prefix_caching:
            s.tokens.frombytes(data[:4 * n])
            self._register(s, n)
        self._logical += self._seq_units(s)
        self.stats.prefix_queried_tokens += prompt_len
        self.stats.prefix_hit_tokens += hit
        return Admission(num_cached_tokens=hit)

    def _took(self, kind_index: int, blocks: int) -> None:
        self._held[kind_index] += blocks
        self._peak[kind_index] = max(self._peak[kind_index], self._held[kind_index])

    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[tuple[int, int]] | None:
        """Room for ``len(token_ids)`` tokens written this step, after freeing the blocks the
        window left behind; returns the copy-on-write copies, or None (nothing changed)."""
        s = self._get(seq_id)
        k, n = len(token_ids), s.num_tokens
        if n + k > s.final_len:
            raise ValueError(f"seq {seq_id}: appending {k} tokens to {n} exceeds its final_len "
                             f"{s.final_len}; the sequence must end (free it) instead")
        if k == 0:
            return []
        pool, ref, new_n = self.pool, self.pool.ref_cnt, n + k
        need = released = 0
        plans = []
        for i in self._attention:
            kind, kt = self.layout.kinds[i], s.kinds[i]
            t = kind.tokens_per_block
            skip = self._first_live(i, n) - kt.first
            cow = 1 if n % t and ref[kt.tables[0][-1]] > 1 else 0
            grow = -(-new_n // t) - -(-n // t)
            released += sum(gather(ref, table[:skip]).count(1) for table in kt.tables) if skip else 0
            need += kind.num_groups * (cow + grow)
            plans.append((i, skip, cow, grow))
        if need > pool.num_free + released:
            return None
        copies: list[tuple[int, int]] = []
        for i, skip, cow, grow in plans:
            self._grow(s, i, n, new_n, skip, cow, grow, copies)
        s.num_tokens = new_n
        self._logical += k * sum(self._token_units[i] for i in self._attention)
        if self.enable_prefix_caching:
            extend_tokens(s.tokens, token_ids)
            self._register(s, new_n)
        return copies

    def _grow(self, s: _Seq, i: int, n: int, new_n: int, skip: int, cow: int, grow: int,
              copies: list[tuple[int, int]]) -> None:
        """One kind's part of ``append``: window frees, copy-on-write, new blocks, ledger."""
        kind, kt, ledger, pool = self.layout.kinds[i], s.kinds[i], self._ledgers[i], self.pool
        t = kind.tokens_per_block
        if skip:
            self._held[i] -= gather(pool.ref_cnt, kt.tables[0][:skip]).count(1)
            for table in kt.tables:
                pool.free(table[skip - 1::-1])  # NOTE: the newest first, as vLLM frees them
                del table[:skip]
            kt.first += skip
            self._window_freed[i] += skip * kind.num_groups
            self._logical -= skip * t * self._token_units[i]
        last = -(-n // t) - 1
        if n % t:
            ledger.remove_owner(kt.tables[0][-1], n % t, min(t, s.final_len - last * t))
        for table in kt.tables:
            if cow:
                src, dst = table[-1], pool.allocate(1)[0]
                pool.free((src,))
                table[-1] = dst
                copies.append((src, dst))
            if grow:
                table += pool.allocate(grow)
        self.stats.cow_copies += cow * kind.num_groups
        self._took(i, cow + grow)
        if new_n % t:
            last = new_n // t
            ledger.add_owner(kt.tables[0][-1], new_n % t, min(t, s.final_len - last * t))

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[tuple[int, int]] | None:
        """The child shares the attention blocks and gets a copy of each state page."""
        p = self._get(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"child seq_id {child_id!r} already exists: fork into a new id")
        if final_len < p.num_tokens:
            raise ValueError(f"child final_len {final_len} < the {p.num_tokens} tokens it "
                             f"inherits from seq {parent_id}")
        kinds = self.layout.kinds
        if sum(k.num_groups for k in kinds if k.tokens_per_block is None) > self.pool.num_free:
            return None
        copies, tables = [], []
        for i, (k, kt) in enumerate(zip(kinds, p.kinds)):
            t = k.tokens_per_block
            if t is None:
                own = [self.pool.allocate(1) for _ in kt.tables]
                copies += [(old[0], new[0]) for old, new in zip(kt.tables, own)]
                self._took(i, 1)
            else:
                own = [list(table) for table in kt.tables]
                for table in own:
                    self.pool.touch_many(table)
                if p.num_tokens % t:
                    self._ledgers[i].add_owner(own[0][-1], p.num_tokens % t,
                                               min(t, final_len - p.num_tokens // t * t))
            tables.append(_Tables(own, kt.first, kt.keyed, kt.last_key))
        c = self._seqs[child_id] = _Seq(p.num_tokens, final_len, tables, array("i", p.tokens))
        self._logical += self._seq_units(c)
        self.stats.fork_copies += len(copies)
        return copies

    def free(self, seq_id: int) -> None:
        s = self._get(seq_id)
        del self._seqs[seq_id]
        self._logical -= self._seq_units(s)
        for i, (k, kt) in enumerate(zip(self.layout.kinds, s.kinds)):
            t = k.tokens_per_block
            if t is not None and s.num_tokens % t:
                self._ledgers[i].remove_owner(kt.tables[0][-1], s.num_tokens % t,
                                              min(t, s.final_len - s.num_tokens // t * t))
            if kt.tables[0]:
                self._held[i] -= gather(self.pool.ref_cnt, kt.tables[0]).count(1)
            for table in kt.tables:
                self.pool.free(table[::-1])  # NOTE: tail first, so the tail is evicted first

    def swap_out(self, seq_id: int) -> None:
        """Not offered: the scheduler recomputes the sequence instead."""
        self._get(seq_id)
        return None

    def swap_in(self, seq_id: int) -> list[tuple[int, int]] | None:
        raise ValueError(f"seq {seq_id} was never swapped out (paged_hybrid does not swap)")

    # ------------------------------------------------------------ accounting
    def breakdown(self, memory_blocked: bool) -> MemoryBreakdown:
        """O(groups). Token states, reserved and rounding per kind from its ledger, in
        units; a linear group's state is token states; unfilled page bytes are padding."""
        token_states = reserved = rounding = padding = 0
        pages = []
        for i, k in enumerate(self.layout.kinds):
            held, units = self._held[i], self._token_units[i]
            if k.tokens_per_block is None:
                token_states += held * units
            else:
                tokens, empty, beyond = self._ledgers[i].slots(held * k.tokens_per_block)
                token_states, reserved, rounding = (token_states + tokens * units,
                                                    reserved + empty * units, rounding + beyond * units)
            padding += held * self._padding_units[i]
            pages.append(held * k.num_groups)
        page = self.layout.page_units
        return make_breakdown(
            capacity_slots=self.capacity_slots,
            allocated_slots=(self.num_blocks - self.pool.num_free) * page,
            token_states=token_states, reserved=reserved, internal_over_reservation=0,
            internal_rounding=rounding, internal_page_padding=padding,
            memory_blocked=memory_blocked, logical_tokens=self._logical,
            largest_free_extent=self.pool.num_free * page,
            cached_free_slots=self.pool.num_cached_free * page, group_blocks=tuple(pages))

    def layer_group_report(self) -> dict:
        """The page layout and, per layer kind, its groups and block counters (results.json)."""
        lay = self.layout
        return {
            "group_size": lay.group_size, "block_size": lay.block_size,
            "attention_block_size": lay.attention_block_size, "page_bytes": lay.page_bytes,
            "num_pages": lay.num_pages, "slot_bytes": lay.unit_bytes,
            "kinds": [{"kind": k.kind, "kv_cache_groups": k.num_groups, "layers": sum(k.group_layers),
                       "padding_layers": lay.group_size * k.num_groups - sum(k.group_layers),
                       "tokens_per_block": k.tokens_per_block, "window": k.window,
                       "peak_blocks": self._peak[i] * k.num_groups,
                       "window_freed_blocks": self._window_freed[i],
                       "prefix_hit_blocks": self._hit_blocks[i]}
                      for i, k in enumerate(lay.kinds)],
        }
