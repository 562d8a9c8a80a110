"""The hybrid KV manager: one block table per KV cache group over one shared pool
(vLLM v1's ``HybridKVCacheManager`` / ``HybridKVCacheCoordinator``).

The layer groups of the model (full, MLA, sliding window, linear) are cut into KV cache
groups of equal layer count whose pages all have one size (``pagebench.allocators.hybrid_layout``).
Every KV cache group keeps its own block table per sequence and allocates from the one
``BlockPool``; the groups of one kind move in lockstep (the same number of blocks at the
same moments), so the manager keeps them together, as vLLM's coordinator does per spec.

- Full and MLA groups hold every block of the sequence, as ``paged`` does.
- Sliding-window groups free the blocks no query can see any more, by vLLM's
  ``SlidingWindowManager.remove_skipped_blocks``: before tokens are appended to a
  sequence of ``n`` tokens, the next query (position ``n``) sees ``n - W + 1 .. n``, so
  the blocks wholly before ``n - W + 1`` go back to the free list (newest first, still
  cached and evictable). A decode step then holds at most ``ceil((W - 1) / b) + 1``
  blocks a group; a prefill chunk of ``k`` tokens the blocks of ``W + k - 1`` tokens.
- A linear group holds exactly one page per sequence: its recurrent state.

Prefix caching per KV cache group (keys salted with the group id, as vLLM's
``BlockHashWithGroupId``): a prompt hits the longest prefix every group serves
(``hybrid_layout.common_hit``); a sliding group holds only the blocks of it the next
query reads. A model with a linear group serves no prefix hits (the recurrent state
after a prefix is not kept; vLLM caches it only in its experimental ``align`` mode).

Not offered: swap (``swap_out`` returns None, so the scheduler recomputes) and a torch
layout (``tensor_layout = "none"``: engine=sim only). A fork shares the attention blocks
and copies each linear group's state page. Fast-forward (``bulk_decode = "hybrid"``,
``harness.engine.fast_forward_hybrid``) runs a span of decode steps without the
scheduler, reading the span's block events (``decode_span_events``) and the waiting
head's need (``admission_need``) to know it ends where the scheduler would decide
otherwise.
"""

from __future__ import annotations

from array import array
from typing import Sequence

from pagebench.allocators.accounting import KindLedger, make_breakdown
from pagebench.allocators.base import Admission, Capabilities, ManagerStats, MemoryBreakdown, register_manager
from pagebench.allocators.block_pool import BlockPool, gather
from pagebench.allocators.hybrid_layout import GroupPrefixCache, HybridLayout, LayoutError, build_layout
from pagebench.allocators.prefix_keys import extend_tokens, token_bytes
from harness.errors import ConfigError


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


def _layout(system, model, pool_bytes: int) -> HybridLayout:
    return build_layout(model.layer_groups, system.block_size, pool_bytes, model.max_context)


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
            layout = _layout(system, model, pool_bytes)
        except LayoutError as error:
            raise ConfigError(f"allocator.{system.name}.{error.key}: {error}") from None
        if layout.num_pages < 1:
            raise ConfigError(f"allocator.{system.name}.block_size: a page of {layout.page_bytes:,} "
                              f"bytes is larger than the whole KV pool ({pool_bytes:,} bytes)")
        return cls(layout, enable_prefix_caching=system.prefix_caching, name=system.name)

    @staticmethod
    def system_problem(system, model) -> tuple[str, str] | None:
        try:
            if model is not None and system.block_size is not None:
                _layout(system, model, 0)
        except LayoutError as error:
            return error.key, str(error)
        return None

    @staticmethod
    def label(system) -> str:
        return f"paged hybrid (block {system.block_size}{', prefix cache' if system.prefix_caching else ''})"

    @staticmethod
    def kernel_layout(system, model) -> tuple[str, int | None]:
        """Block tables of the attention block: ``block_size`` tokens, or the raised block
        a model with linear layers gets (its page holds a recurrent state)."""
        return "paged", _layout(system, model, 0).attention_block_size

    def __init__(self, layout: HybridLayout, *, enable_prefix_caching: bool = True,
                 name: str = "paged_hybrid") -> None:
        kinds = self.kinds = layout.kinds
        self.name, self.layout, self.block_size = name, layout, layout.block_size
        self.num_blocks = layout.num_pages
        self.capacity_slots = layout.num_pages * layout.page_units
        self.slot_bytes = layout.unit_bytes
        self.pool = BlockPool(layout.num_pages)
        self._attention = [i for i, k in enumerate(kinds) if k.tokens_per_block is not None]
        self.enable_prefix_caching = bool(enable_prefix_caching) and len(self._attention) == len(kinds)
        self.stats = ManagerStats()
        self.capabilities = Capabilities(layout=self.tensor_layout, layer_groups=True,
                                         bulk_decode="hybrid",
                                         prefix_cache=self.enable_prefix_caching, swaps=False,
                                         block_residency=True)
        self._primary = next((i for i in self._attention if kinds[i].kind != "sliding"),
                             self._attention[0])  # the kind slot_mapping maps
        self._ledgers = [KindLedger(k.tokens_per_block, layout.units(k.content_bytes),
                                    layout.padding_units(k)) for k in kinds]
        self._decode_units = sum(self._ledgers[i].token_units for i in self._attention)
        self._window_freed = [0] * len(kinds)  # blocks (all groups) freed by the window
        self._hit_blocks = [0] * len(kinds)  # blocks (all groups) reused from the cache
        self._seqs: dict[int, _Seq] = {}
        self._logical = 0
        self.cache = GroupPrefixCache(self.pool, kinds, self.enable_prefix_caching)

    # ---------------------------------------------------------------- queries
    def attach_residency(self, log) -> None:
        """Record every page's transitions in ``log`` (a ``ResidencyLog``)."""
        self.pool.residency = log

    def _get(self, seq_id: int) -> _Seq:
        s = self._seqs.get(seq_id)
        if s is None:
            raise ValueError(f"unknown seq_id {seq_id!r}: admit it (or fork into it) first")
        return s

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def block_tables(self, seq_id: int) -> list[list[int]]:
        """Each KV cache group's live blocks of the sequence, in group id order (copies)."""
        return [list(t) for kt in self._get(seq_id).kinds for t in kt.tables]

    def _seq_units(self, s: _Seq) -> int:
        """Units the sequence's KV would take if nothing were shared (its logical tokens)."""
        return sum(ledger.token_units * (1 if k.tokens_per_block is None
                                         else s.num_tokens - kt.first * k.tokens_per_block)
                   for k, kt, ledger in zip(self.kinds, s.kinds, self._ledgers))

    def fits_empty_pool(self, prompt_len: int, final_len: int) -> bool:
        return self._peak_pages(prompt_len, final_len) <= self.num_blocks

    def member_slots(self, prompt_len: int, final_len: int) -> int:
        return self._peak_pages(prompt_len, final_len) * self.layout.page_units

    def _peak_pages(self, prompt_len: int, final_len: int) -> int:
        return sum(k.num_groups * k.peak_blocks(prompt_len, final_len) for k in self.kinds)

    def slot_mapping(self, seq_id: int, start: int, end: int) -> list[int]:
        """Each position's unit index in the first group of the primary kind (the first
        full or MLA kind, else sliding): ``block * page_units + offset * token_units``."""
        s = self._get(seq_id)
        k, kt = self.kinds[self._primary], s.kinds[self._primary]
        t = k.tokens_per_block
        if not kt.first * t <= start <= end <= s.num_tokens:
            raise ValueError(f"slot range [{start}, {end}) is outside the live tokens "
                             f"[{kt.first * t}, {s.num_tokens}) of seq {seq_id}")
        page, unit = self.layout.page_units, self.layout.units(k.layer_bytes * k.group_layers[0])
        return [kt.tables[0][p // t - kt.first] * page + p % t * unit for p in range(start, end)]

    def cached_prefix_tokens(self, prompt_token_ids: Sequence[int]) -> int:
        return self.cache.hit_tokens(token_bytes(prompt_token_ids))

    # ----------------------------------------------------------- life cycle
    def _admission(self, data: bytes, num_tokens: int) -> tuple:
        """(hit tokens, tokens held, per kind (first live block, hit blocks per group), new
        blocks, hit blocks that leave the free queue). Changes nothing."""
        hit, hit_blocks = self.cache.hit(data)
        n = max(num_tokens, hit)
        plans, new, taken = [], 0, 0
        for i, k in enumerate(self.kinds):
            t = k.tokens_per_block
            first = k.first_live(hit) if t else 0
            blocks = hit_blocks.get(i) or [[] for _ in k.group_ids]
            taken += sum(gather(self.pool.ref_cnt, b).count(0) for b in blocks)
            plans.append((first, blocks))
            new += k.num_groups * (1 if t is None else -(-n // t) - hit // t)
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
        pool = self.pool
        for i, (ledger, (_, blocks)) in enumerate(zip(self._ledgers, plans)):
            ledger.take(gather(pool.ref_cnt, blocks[0]).count(0))  # NOTE: before touching them
            self._hit_blocks[i] += sum(map(len, blocks))
            for b in blocks:
                pool.touch_many(b)
        kinds = []
        for k, ledger, (first, blocks) in zip(self.kinds, self._ledgers, plans):
            t = k.tokens_per_block
            grow = 1 if t is None else -(-n // t) - hit // t
            tables = [b + pool.allocate(grow) for b in blocks]
            ledger.take(grow)
            keyed = hit // t if t else 0
            last_key = self.cache.prompt_keys(data, t).keys(keyed - 1, keyed)[0] if keyed else 0
            kinds.append(_Tables(tables, first, keyed, last_key))
            if tables[0]:  # NOTE: empty only for a window of 1 token and a hit of whole blocks
                ledger.add_tail(tables[0][-1], n, final_len)
        s = self._seqs[seq_id] = _Seq(n, final_len, kinds, array("i"))
        if self.enable_prefix_caching:
            s.tokens.frombytes(data[:4 * n])
            self.cache.register(s.kinds, s.tokens, n)
        self._logical += self._seq_units(s)
        self.stats.prefix_queried_tokens += prompt_len
        self.stats.prefix_hit_tokens += hit
        return Admission(num_cached_tokens=hit)

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
        ref, new_n = self.pool.ref_cnt, n + k
        need = released = 0
        plans = []
        for i in self._attention:
            kind, kt = self.kinds[i], s.kinds[i]
            t = kind.tokens_per_block
            skip = kind.first_live(n) - kt.first
            cow = 1 if n % t and ref[kt.tables[0][-1]] > 1 else 0
            grow = -(-new_n // t) - -(-n // t)
            released += sum(gather(ref, table[:skip]).count(1) for table in kt.tables) if skip else 0
            need += kind.num_groups * (cow + grow)
            plans.append((i, skip, cow, grow))
        if need > self.pool.num_free + released:
            return None
        copies: list[tuple[int, int]] = []
        for i, skip, cow, grow in plans:
            self._grow(s, i, new_n, skip, cow, grow, copies)
        s.num_tokens = new_n
        self._logical += k * self._decode_units
        if self.enable_prefix_caching:
            extend_tokens(s.tokens, token_ids)
            self.cache.register(s.kinds, s.tokens, new_n)
        return copies

    def _grow(self, s: _Seq, i: int, new_n: int, skip: int, cow: int, grow: int,
              copies: list[tuple[int, int]]) -> None:
        """One kind's part of ``append``: window frees, copy-on-write, new blocks, ledger."""
        kind, kt, ledger, pool = self.kinds[i], s.kinds[i], self._ledgers[i], self.pool
        if skip:
            ledger.blocks -= gather(pool.ref_cnt, kt.tables[0][:skip]).count(1)
            for table in kt.tables:
                pool.free(table[skip - 1::-1])  # NOTE: the newest first, as vLLM frees them
                del table[:skip]
            kt.first += skip
            self._window_freed[i] += skip * kind.num_groups
            self._logical -= skip * kind.tokens_per_block * ledger.token_units
        if kt.tables[0]:
            ledger.remove_tail(kt.tables[0][-1], s.num_tokens, s.final_len)
        for table in kt.tables:
            if cow:
                src, dst = table[-1], pool.allocate(1)[0]
                pool.free((src,))
                table[-1] = dst
                copies.append((src, dst))
            if grow:
                table += pool.allocate(grow)
        self.stats.cow_copies += cow * kind.num_groups
        ledger.take(cow + grow)
        ledger.add_tail(kt.tables[0][-1], new_n, s.final_len)

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[tuple[int, int]] | None:
        """The child shares the attention blocks and gets a copy of each state page."""
        p = self._get(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"child seq_id {child_id!r} already exists: fork into a new id")
        if final_len < p.num_tokens:
            raise ValueError(f"child final_len {final_len} < the {p.num_tokens} tokens it "
                             f"inherits from seq {parent_id}")
        if sum(k.num_groups for k in self.kinds if k.tokens_per_block is None) > self.pool.num_free:
            return None
        copies, tables = [], []
        for k, kt, ledger in zip(self.kinds, p.kinds, self._ledgers):
            if k.tokens_per_block is None:
                own = [self.pool.allocate(1) for _ in kt.tables]
                copies += [(old[0], new[0]) for old, new in zip(kt.tables, own)]
                ledger.take(1)
            else:
                own = [list(table) for table in kt.tables]
                for table in own:
                    self.pool.touch_many(table)
                if own[0]:
                    ledger.add_tail(own[0][-1], p.num_tokens, final_len)
            tables.append(_Tables(own, kt.first, kt.keyed, kt.last_key))
        c = self._seqs[child_id] = _Seq(p.num_tokens, final_len, tables, array("i", p.tokens))
        self._logical += self._seq_units(c)
        self.stats.fork_copies += len(copies)
        return copies

    def free(self, seq_id: int) -> None:
        s = self._get(seq_id)
        del self._seqs[seq_id]
        self._logical -= self._seq_units(s)
        for kt, ledger in zip(s.kinds, self._ledgers):
            if kt.tables[0]:
                ledger.remove_tail(kt.tables[0][-1], s.num_tokens, s.final_len)
                ledger.blocks -= gather(self.pool.ref_cnt, kt.tables[0]).count(1)
            for table in kt.tables:
                self.pool.free(table[::-1])  # NOTE: tail first, so the tail is evicted first

    # ------------------------------------- fast-forward (bulk_decode "hybrid", HybridBulkDecode)
    def can_append_without_copy(self, seq_id: int) -> bool:
        """Would a token appended to the sequence now copy no block (no partial last block
        it shares)? Stays true while it only decodes: its new blocks are its own."""
        s, ref = self._get(seq_id), self.pool.ref_cnt
        n = s.num_tokens
        return not any(n % self.kinds[i].tokens_per_block and ref[s.kinds[i].tables[0][-1]] > 1
                       for i in self._attention)

    def decode_span_events(self, seq_ids: Sequence[int], span: int) -> tuple[list[int], list[int]]:
        """``[span]`` each: the blocks the next ``span`` decode steps of these sequences (one
        token each, every step) allocate, and the table entries the window drops in each
        (at least the blocks those steps return to the free queue: a block another table
        holds too only loses a reference). Assumes no copies (``can_append_without_copy``).

        A sequence at ``n`` tokens starts a block at appends ``(-n) % t + 1``, then every
        ``t``; a sliding kind first drops what it holds before ``first_live(n)``, then one
        block each time ``n + j - W + 1`` (the first position step ``j``'s query sees)
        reaches a positive multiple of ``t``."""
        taken, dropped = [0] * span, [0] * span
        for seq_id in seq_ids:
            s = self._seqs[seq_id]
            n = s.num_tokens
            for i in self._attention:
                kind, kt = self.kinds[i], s.kinds[i]
                t, groups = kind.tokens_per_block, kind.num_groups
                for j in range((-n) % t, span, t):  # 0-based step: append j + 1 writes n + j
                    taken[j] += groups
                if kind.kind != "sliding":
                    continue
                dropped[0] += groups * (kind.first_live(n) - kt.first)
                lead = n - kind.window + 1
                first = (-lead) % t or t  # the first step j >= 1 with lead + j a multiple of t
                if lead + first < t:
                    first = t - lead
                for j in range(first, span, t):
                    dropped[j] += groups
        return taken, dropped

    def admission_need(self, prompt_token_ids: Sequence[int], num_tokens: int) -> tuple[int, set[int]]:
        """What ``admit(..., prompt_token_ids, ..., num_tokens)`` needs now: the free blocks it
        would take (new ones, and the free cached blocks of its hit), and the blocks of its
        hit. While none of those is evicted and no block is registered under a key of the
        prompt, the hit stays the same, so the need does not fall (a hit block released
        joins the need and the free blocks alike)."""
        _, _, plans, new, taken = self._admission(token_bytes(prompt_token_ids), num_tokens)
        return new + taken, {b for _, blocks in plans for table in blocks for b in table}

    def next_blocks(self, n: int) -> list[int]:
        """The next ``n`` blocks an allocation takes (whose keys it would evict), head first."""
        return self.pool.next_blocks(n)

    def swap_out(self, seq_id: int) -> None:
        """Not offered: the scheduler recomputes the sequence instead."""
        self._get(seq_id)
        return None

    def swap_in(self, seq_id: int) -> list[tuple[int, int]] | None:
        raise ValueError(f"seq {seq_id} was never swapped out (paged_hybrid does not swap)")

    # ------------------------------------------------------------ accounting
    def breakdown(self, memory_blocked: bool) -> MemoryBreakdown:
        """O(kinds): each kind's ledger, in units (a linear kind's state is token states)."""
        token_states, reserved, rounding, padding = map(sum, zip(*(x.slots() for x in self._ledgers)))
        page = self.layout.page_units
        return make_breakdown(
            capacity_slots=self.capacity_slots,
            allocated_slots=(self.num_blocks - self.pool.num_free) * page,
            token_states=token_states, reserved=reserved, internal_over_reservation=0,
            internal_rounding=rounding, internal_page_padding=padding,
            memory_blocked=memory_blocked, logical_tokens=self._logical,
            largest_free_extent=self.pool.num_free * page,
            cached_free_slots=self.pool.num_cached_free * page,
            group_blocks=tuple(x.blocks * k.num_groups for x, k in zip(self._ledgers, self.kinds)))

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
                       "peak_blocks": x.peak * k.num_groups, "window_freed_blocks": freed,
                       "prefix_hit_blocks": hits}
                      for k, x, freed, hits in zip(lay.kinds, self._ledgers, self._window_freed,
                                                   self._hit_blocks)],
        }
