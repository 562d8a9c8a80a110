"""RadixAttention-style prefix cache: a radix tree over token ids (as SGLang's RadixCache).

KV memory is in pages of ``page_size`` tokens (1 = token granularity, SGLang's default;
``page_size`` = the block size = vLLM's granularity); ``page_size`` divides the block size.
Each tree node holds a run of tokens (a multiple of ``page_size``) and their pages. A new
request matches the longest cached prefix page by page (capped at ``len(prompt) - 1``
tokens, so one is computed), splitting a node where the match ends inside it, and locks
the matched path (``lock_ref`` up to the root) while it runs. Its own tokens live in
private pages. After each prefill chunk its full pages of prompt tokens are inserted
into the tree and it locks them instead (SGLang's ``cache_unfinished_req``), so requests
running at once share a prompt; when it ends (finished, or preempted for recompute) the
rest of its full pages are inserted and its lock released (``cache_finished_req``).
Pages holding tokens the tree has already are freed as duplicates. When
memory is short, unlocked leaves are evicted least recently used first (a parent left
without children becomes a leaf in turn).

Breakdown: locked tree pages and private pages are allocated; unlocked tree pages are
free but hold reusable KV (``cached_free_slots``, like the paged system's cached free
blocks). A sequence's last private page is reserved up to its final length and internal
fragmentation beyond. Fork copies the parent's private tokens (the shared prefix stays
shared through the tree); swap is not offered (the scheduler recomputes instead).

Torch layout: paged, a page being a physical block of ``page_size`` slots (slot = page *
page_size + offset; ``block_table`` lists a sequence's pages), with slot-pair copies.
"""

from __future__ import annotations

import heapq
from itertools import count
from typing import Iterable, Sequence

import numpy as np

from pagebench.allocators.accounting import make_breakdown
from pagebench.allocators.base import (Admission, Capabilities, ManagerStats, MemoryBreakdown, append_in_order,
                             register_manager)


class _Node:
    __slots__ = ("key", "pages", "children", "parent", "lock_ref", "last_access")

    def __init__(self, key: tuple, pages: list[int], parent: "_Node | None") -> None:
        self.key = key  # token ids, a multiple of page_size
        self.pages = pages  # one page per page_size tokens of key
        self.children: dict[tuple, _Node] = {}  # by the first page of the child's key
        self.parent = parent
        self.lock_ref = 0  # running sequences whose matched prefix passes through here
        self.last_access = 0


class _Seq:
    __slots__ = ("node", "prefix_pages", "tokens", "private", "final_len", "prompt_len")

    def __init__(self, node: _Node, prefix_pages: list[int], tokens: list[int], final_len: int,
                 prompt_len: int):
        self.prompt_len = prompt_len
        self.node = node  # deepest node of the matched (locked) prefix
        self.prefix_pages = prefix_pages  # its pages, root to node
        self.tokens = tokens  # every token written
        self.private: list[int] = []  # pages of tokens past the prefix
        self.final_len = final_len  # accounting only


@register_manager("radix")
class RadixKVCacheManager:
    """A radix tree of cached prefixes over ``num_pages`` pages of ``page_size`` slots."""

    options = ("page_size",)
    tensor_layout = "paged"  # a page is a physical block of page_size slots
    uses_block_size = True

    @classmethod
    def from_system(cls, system, capacity_slots: int, cpu_slots: int, max_model_len: int,
                    model) -> "RadixKVCacheManager":
        """The catalog entry ``kind: radix`` (``page_size``: null = the block size)."""
        page = system.option("page_size") or system.block_size
        return cls(capacity_slots // page, page, name=system.name)

    @staticmethod
    def system_problem(system, model) -> tuple[str, str] | None:
        page, block = system.option("page_size"), system.block_size
        if page is None:
            return None
        if isinstance(page, bool) or not isinstance(page, int) or page < 1 or block % page:
            return "page_size", (f"must be a positive divisor of the block size {block} (1 = token "
                                 f"granularity, null = {block}), got {page!r}")
        return None

    @staticmethod
    def label(system) -> str:
        page = system.option("page_size") or system.block_size
        return f"radix (page {page})"

    @staticmethod
    def kernel_layout(system, model) -> tuple[str, int | None]:
        """The decode kernel's layout the cost model prices: a page table (SGLang's token-to-KV index) of page_size."""
        return "paged", system.option("page_size") or system.block_size

    def __init__(self, num_pages: int, page_size: int, *, name: str = "radix") -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"need >= 1 page of >= 1 slot, got {num_pages} of {page_size}")
        self.name, self.page_size, self.num_pages = name, page_size, num_pages
        self.capacity_slots = num_pages * page_size
        self.stats = ManagerStats()
        self.capabilities = Capabilities(layout=self.tensor_layout, batched_decode=True, prefix_cache=True,
                                         slot_copies=True, swaps=False)
        self.root = _Node((), [], None)
        self.root.lock_ref = 1  # never evicted
        self._free = list(range(num_pages - 1, -1, -1))  # pop() -> lowest page
        self._seqs: dict[int, _Seq] = {}
        self._clock = count(1)
        self._evictable = 0  # pages of unlocked nodes
        self._locked = 0  # pages of locked nodes
        self._private = 0  # private pages of all sequences
        self._written = 0  # tokens written, over sequences (logical)
        self._private_written = 0  # of those, in private pages
        self._to_fill = 0  # sum over sequences of min(final_len, slots they hold)

    # ------------------------------------------------------------------ tree
    def _match(self, tokens: Sequence[int], split: bool) -> tuple[_Node, list[int], int]:
        """The deepest node matching ``tokens`` page by page, the matched pages, and how
        many of them are unlocked now; with ``split``, a node matched only partly is split
        at the last matched page."""
        p, node, pages, i, unlocked = self.page_size, self.root, [], 0, 0
        while len(tokens) - i >= p:
            child = node.children.get(tuple(tokens[i:i + p]))
            if child is None:
                break
            key = child.key
            if tuple(tokens[i:i + len(key)]) == key:
                n = len(key)  # the whole node (the common case: C speed)
            else:  # NOTE: the first page matched (it is the child's dict key): page by page
                n = p
                while i + n + p <= len(tokens) and tuple(tokens[i + n:i + n + p]) == key[n:n + p]:
                    n += p
            unlocked += n // p if child.lock_ref == 0 else 0
            if n < len(key):
                if not split:
                    return node, pages + child.pages[:n // p], unlocked
                child = self._split(child, n)
            pages += child.pages
            node, i = child, i + n
        return node, pages, unlocked

    def _split(self, child: _Node, n: int) -> _Node:
        """Cut ``child`` after ``n`` tokens; the new upper node takes its lock count."""
        p = self.page_size
        upper = _Node(child.key[:n], child.pages[:n // p], child.parent)
        upper.lock_ref, upper.last_access = child.lock_ref, child.last_access
        upper.children[child.key[n:n + p]] = child
        child.parent.children[child.key[:p]] = upper
        child.key, child.pages, child.parent = child.key[n:], child.pages[n // p:], upper
        return upper

    def _lock(self, node: _Node, delta: int) -> None:
        now = next(self._clock)
        while node is not self.root:
            if node.lock_ref == 0 or node.lock_ref + delta == 0:
                moved = delta * len(node.pages)
                self._locked += moved
                self._evictable -= moved
            node.lock_ref += delta
            node.last_access = now
            node = node.parent

    def _evict(self, need: int) -> None:
        """Free unlocked leaves, least recently used first, until ``need`` pages are free."""
        heap, order = [], count()
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children and node.lock_ref == 0:
                heap.append((node.last_access, next(order), node))
        heapq.heapify(heap)
        while len(self._free) < need and heap:
            _, _, leaf = heapq.heappop(heap)
            self._give(leaf.pages)
            self._evictable -= len(leaf.pages)
            self.stats.evicted_slots += len(leaf.pages) * self.page_size
            parent = leaf.parent
            del parent.children[leaf.key[:self.page_size]]
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, next(order), parent))

    def _take(self, n: int) -> list[int] | None:
        if n > len(self._free) + self._evictable:
            return None
        if n > len(self._free):
            self._evict(n)
        return [self._free.pop() for _ in range(n)]

    def _insert(self, s: _Seq, running: bool) -> None:
        """Put the sequence's full private pages into the tree; pages of tokens the tree
        holds already are freed as duplicates. ``running`` (a prefill chunk done, as
        SGLang's ``cache_unfinished_req``): the sequence then holds the tree's pages of
        those tokens and locks the new deepest node; else (it ends, ``cache_finished_req``)
        its partial tail page is freed too."""
        p, tokens = self.page_size, s.tokens
        full = len(tokens) // p * p
        node, pages, _ = self._match(tokens[:full], split=True)
        known = len(pages) * p  # tokens the tree holds already
        start = len(s.prefix_pages) * p  # where the private pages begin
        keep = max(0, (known - start) // p)
        self._give(s.private[:keep])  # duplicates of what is cached now
        new = s.private[keep:(full - start) // p]
        tail = s.private[keep + len(new):]
        if new:
            leaf = _Node(tuple(tokens[known:full]), new, node)
            leaf.last_access = next(self._clock)
            node.children[leaf.key[:p]] = leaf
            self._evictable += len(new)
            node = leaf
        if running:
            self._lock(node, +1)
            self._lock(s.node, -1)
            s.node, s.prefix_pages, s.private = node, pages + new, tail
        else:
            self._give(tail)

    def _give(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))
        self._free.sort(reverse=True)

    # -------------------------------------------------------------- protocol
    def fits_empty_pool(self, prompt_len: int, final_len: int) -> bool:
        return -(-final_len // self.page_size) <= self.num_pages

    def member_slots(self, prompt_len: int, final_len: int) -> int:
        return final_len

    def _hits(self, prompt_token_ids: Sequence[int]) -> tuple[_Node, list[int], int]:
        return self._match(self._matchable(prompt_token_ids), split=False)

    def _matchable(self, prompt_token_ids: Sequence[int]) -> list[int]:
        """The prompt's tokens a match may cover: whole pages, at most ``len - 1`` tokens."""
        limit = (len(prompt_token_ids) - 1) // self.page_size * self.page_size
        head = prompt_token_ids[:limit]
        return head.tolist() if isinstance(head, np.ndarray) else [int(t) for t in head]

    def cached_prefix_tokens(self, prompt_token_ids: Sequence[int]) -> int:
        return len(self._hits(prompt_token_ids)[1]) * self.page_size

    def can_admit(self, prompt_token_ids: Sequence[int], final_len: int, num_tokens: int) -> bool:
        _, pages, unlocked = self._hits(prompt_token_ids)
        # NOTE: admitting locks the matched pages: those unlocked now stop being evictable
        return self._need(pages, num_tokens) <= len(self._free) + self._evictable - unlocked

    def _need(self, pages: list[int], num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.page_size) - len(pages))

    def admit(self, seq_id: int, prompt_token_ids: Sequence[int], final_len: int,
              num_tokens: int) -> Admission | None:
        if seq_id in self._seqs:
            raise ValueError(f"seq_id {seq_id!r} is already admitted: free it first or use a new id")
        prompt_len = len(prompt_token_ids)
        if not 1 <= num_tokens <= prompt_len <= final_len:
            raise ValueError(f"seq {seq_id}: need 1 <= num_tokens {num_tokens} <= prompt length "
                             f"{prompt_len} <= final_len {final_len}")
        if not self.can_admit(prompt_token_ids, final_len, num_tokens):
            return None
        node, pages, _ = self._match(self._matchable(prompt_token_ids), split=True)
        self._lock(node, +1)  # NOTE: before taking pages, so the match is not evicted
        hit = len(pages) * self.page_size
        n = max(num_tokens, hit)
        head = prompt_token_ids[:n]
        s = _Seq(node, pages, head.tolist() if isinstance(head, np.ndarray) else [int(t) for t in head],
                 final_len, prompt_len)
        s.private = self._take(self._need(pages, n))
        self._seqs[seq_id] = s
        self._cache_prefill(s)
        self._account(s, +1)
        self.stats.prefix_queried_tokens += prompt_len
        self.stats.prefix_hit_tokens += hit
        return Admission(num_cached_tokens=hit)

    def _account(self, s: _Seq, sign: int) -> None:
        held = (len(s.prefix_pages) + len(s.private)) * self.page_size
        n = len(s.tokens)
        self._private += sign * len(s.private)
        self._written += sign * n
        self._private_written += sign * (n - len(s.prefix_pages) * self.page_size)
        self._to_fill += sign * (min(s.final_len, held) - n)

    def _get(self, seq_id: int) -> _Seq:
        s = self._seqs.get(seq_id)
        if s is None:
            raise ValueError(f"unknown seq_id {seq_id!r}: admit it (or fork into it) first")
        return s

    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[tuple[int, int]] | None:
        s = self._get(seq_id)
        new_n = len(s.tokens) + len(token_ids)
        if new_n > s.final_len:
            raise ValueError(f"seq {seq_id}: appending {len(token_ids)} tokens to "
                             f"{len(s.tokens)} exceeds its final_len {s.final_len}")
        held = len(s.prefix_pages) + len(s.private)
        more = self._take(max(0, -(-new_n // self.page_size) - held))
        if more is None:
            return None
        self._account(s, -1)
        s.private += more
        was = len(s.tokens)
        s.tokens += [int(t) for t in token_ids]
        if was < s.prompt_len:
            self._cache_prefill(s)
        self._account(s, +1)
        return []

    def _cache_prefill(self, s: _Seq) -> None:
        """After a prefill chunk: its full pages of prompt tokens join the tree."""
        if len(s.tokens) - len(s.prefix_pages) * self.page_size >= self.page_size:
            self._insert(s, running=True)

    def append_decode(self, seq_ids: Sequence[int], token_ids: Iterable[int],
                      copies: list[tuple[int, int]]) -> int:
        return append_in_order(self.append, seq_ids, [(token,) for token in token_ids], copies)

    def append_batch(self, seq_ids: Sequence[int], token_lists: Sequence[Sequence[int]],
                     copies: list[tuple[int, int]]) -> int:
        return append_in_order(self.append, seq_ids, token_lists, copies)

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[tuple[int, int]] | None:
        """The child shares the parent's locked prefix and copies its private slots."""
        p = self._get(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"child seq_id {child_id!r} already exists: fork into a new id")
        if final_len < len(p.tokens):
            raise ValueError(f"child final_len {final_len} < the {len(p.tokens)} tokens it inherits")
        private = self._take(len(p.private))
        if private is None:
            return None
        c = _Seq(p.node, p.prefix_pages, list(p.tokens), final_len, p.prompt_len)
        c.private = private
        self._lock(c.node, +1)
        self._seqs[child_id] = c
        self._account(c, +1)
        start = len(p.prefix_pages) * self.page_size
        copies = list(zip(self.slot_mapping(parent_id, start, len(p.tokens)),
                          self.slot_mapping(child_id, start, len(c.tokens))))
        self.stats.fork_copies += len(copies)
        return copies

    def free(self, seq_id: int) -> None:
        s = self._get(seq_id)
        del self._seqs[seq_id]
        self._account(s, -1)
        self._insert(s, running=False)
        self._lock(s.node, -1)

    def swap_out(self, seq_id: int) -> list[tuple[int, int]] | None:
        self._get(seq_id)
        return None  # no CPU pool: the scheduler recomputes instead

    def swap_in(self, seq_id: int) -> list[tuple[int, int]] | None:
        raise ValueError(f"seq {seq_id} is not swapped out (radix never swaps)")

    @property
    def block_size(self) -> int:
        """Slots per page: the torch executor's block of the paged layout."""
        return self.page_size

    @property
    def num_blocks(self) -> int:
        return self.num_pages

    num_cpu_blocks = 0  # never swaps

    def block_table(self, seq_id: int) -> list[int]:
        """The sequence's pages in token order (its matched prefix, then its private pages)."""
        s = self._get(seq_id)
        return s.prefix_pages + s.private

    def slot_mapping(self, seq_id: int, start: int, end: int) -> list[int]:
        s = self._get(seq_id)
        if not 0 <= start <= end <= len(s.tokens):
            raise ValueError(f"slot range [{start}, {end}) is outside seq {seq_id}'s tokens")
        p, pages = self.page_size, s.prefix_pages + s.private
        return [pages[i // p] * p + i % p for i in range(start, end)]

    def breakdown(self, memory_blocked: bool) -> MemoryBreakdown:
        """O(1), from running sums: locked tree pages hold token states; unlocked ones are
        free but cached; private pages hold the rest, their unfilled tails reserved up to
        the final length."""
        p = self.page_size
        allocated = (self._locked + self._private) * p
        private_slots = self._private * p
        reserved = self._to_fill
        return make_breakdown(
            capacity_slots=self.capacity_slots, allocated_slots=allocated,
            token_states=self._locked * p + self._private_written, reserved=reserved,
            internal_over_reservation=0,
            internal_rounding=private_slots - self._private_written - reserved,
            memory_blocked=memory_blocked, logical_tokens=self._written,
            largest_free_extent=self.capacity_slots - allocated,
            cached_free_slots=self._evictable * p)
