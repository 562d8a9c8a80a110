"""The paged KV-cache manager (PagedAttention / vLLM style).

Each sequence has a block table; blocks are allocated on demand as tokens arrive,
so a sequence holding ``n`` tokens owns exactly ``ceil(n / block_size)`` blocks.

Prefix caching: every FULL block gets a cache key (``pagebench.allocators.prefix_keys``: the
chain hash of its tokens and of every block before it), prompt blocks and decode-produced
blocks alike; the manager keeps each sequence's partial tail tokens so it can key a
block when it fills. A sequence given a token source (``set_token_source``) has its ids
read from it when a block fills, and its appends' ids are only counted: the decode path
then builds no ids (``Capabilities.token_sources``). ``admit`` reuses the longest run of
cached leading prompt blocks, capped at ``len(prompt) - 1`` tokens so at least one prompt
token is computed.

With an offload tier (``attach_offload``, ``pagebench.allocators.offload_tier``), a cached block the
pool evicts leaves its key in a CPU (then disk) tier, and ``admit`` continues the run of
prompt hits there after the GPU hits end: those blocks are allocated on the GPU, loaded
(``Admission.cpu_hit_tokens`` / ``disk_hit_tokens``) and not recomputed.

Fork shares every block (ref counts up). The first append into a shared, partially
filled last block copies it (copy-on-write) and returns ``[(src, dst)]``.

Why a manager keeps its own per-sequence record (``_Seq``) rather than the engine's
``harness.engine.sequence.Sequence`` (one sequence type, as nano-vllm has, was weighed and
left): the managers are a library one floor below the harness (pure Python, importing
nothing of it but its shared modules), driven by sequence id alone through the narrow
``KVCacheManager`` protocol (``admit`` / ``append`` / ``fork`` / ``free``, as vLLM v1's
``KVCacheManager`` is driven by request id), and are also driven without any engine
(``tests/test_manager_replay.py``, the theory and hostcost tools). What ``_Seq`` holds is
this manager's private block state (block table, chain keys, partial tail tokens, swapped
CPU blocks, the fast path's ``room``, pending prompt keys), which differs per manager
(``paged_hybrid`` keeps one table per layer kind; contiguous managers an extent). The
engine's ``Sequence`` holds the token stream and its scheduling state. Merged, either the
managers would import the engine (an import up a floor) or every manager's state would
live in one engine class the managers then share; both undo the narrow interface.
"""

from __future__ import annotations

from array import array
from itertools import repeat
from typing import Callable, Iterable, Sequence

import numpy as np

from pagebench.allocators.accounting import PartialBlockLedger
from pagebench.allocators.base import Admission, Capabilities, ManagerStats, MemoryBreakdown, register_manager
from pagebench.allocators.block_pool import BlockPool
from pagebench.allocators.offload_tier import OffloadTiers
from pagebench.allocators.prefix_keys import MASK, MUL, PromptKeys, chain_keys, extend_tokens, token_bytes


_PROMPT_MEMO = 64  # read-only prompts whose chains _prompt keeps (see there)


class _Seq:
    __slots__ = ("table", "num_tokens", "final_len", "prompt_len", "keys", "tail", "cpu_blocks",
                 "room", "known", "source")

    def __init__(self, table: list[int], num_tokens: int, final_len: int, prompt_len: int,
                 keys: list[int], tail: array) -> None:
        self.table = table  # device block ids; [] while swapped out
        self.num_tokens = num_tokens  # KV slots written so far
        self.final_len = final_len  # KV slots when the sequence ends
        self.prompt_len = prompt_len
        self.keys = keys  # cache key of each full block (prefix caching only)
        # token ids in the partial last block (prefix caching only): those of the positions
        # from the first not keyed on; with a ``source``, possibly only the first of them
        self.tail = tail
        self.cpu_blocks: list[int] | None = None  # CPU block ids while swapped out
        # NOTE: appends of up to ``room`` tokens stay inside the sole-owned, partially
        # filled last block (and within final_len): no block, copy or key changes, so
        # they take the fast path. 0 = take the general path (which resets it).
        self.room = 0
        # The admitted tokens while some of their full blocks are not keyed yet, so that
        # chunks of them are keyed from the precomputed keys (prefix caching only).
        self.known: PromptKeys | None = None
        # source(start, end): the ids at positions [start, end) as packed 4-byte ints, read
        # when a block fills (set_token_source; prefix caching only); None: the appends'
        # ids are the tail's
        self.source: Callable[[int, int], bytes] | None = None


@register_manager("paged")
class PagedKVCacheManager:
    """Block tables over a ``BlockPool`` of ``num_blocks`` blocks of ``block_size`` slots."""

    options: tuple[str, ...] = ()  # no keys of its own beyond SystemSpec's
    tensor_layout = "paged"
    uses_block_size = True
    tensor_layout = "paged"  # takes the top-level block_size when its entry gives none

    @classmethod
    def from_system(cls, system, capacity_slots: int, cpu_slots: int, max_model_len: int,
                    model) -> "PagedKVCacheManager":
        """The catalog entry ``kind: paged`` (``block_size``, ``prefix_caching``)."""
        bs = system.block_size
        return cls(capacity_slots // bs, bs, enable_prefix_caching=system.prefix_caching,
                   num_cpu_blocks=cpu_slots // bs)

    @staticmethod
    def system_problem(system, model) -> tuple[str, str] | None:
        return None

    @staticmethod
    def label(system) -> str:
        return f"paged (block {system.block_size}{', prefix cache' if system.prefix_caching else ''})"

    @staticmethod
    def kernel_layout(system, model) -> tuple[str, int | None]:
        """The decode kernel's layout and page (tokens) the cost model prices: block tables of block_size."""
        return "paged", system.block_size

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 num_cpu_blocks: int = 0, name: str = "paged") -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}: "
                             "use e.g. block_size=16")
        if not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}: the pool "
                             "needs at least one block (raise the capacity or lower block_size)")
        if not isinstance(num_cpu_blocks, int) or num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be an int >= 0, got {num_cpu_blocks!r}")
        self.name = name
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.capacity_slots = num_blocks * block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.num_cpu_blocks = num_cpu_blocks
        self.pool = BlockPool(num_blocks)
        self.stats = ManagerStats()
        self.capabilities = Capabilities(layout=self.tensor_layout, batched_decode=True, bulk_decode="paged",
                                         prefix_cache=self.enable_prefix_caching,
                                         block_residency=True, reads_decode_tokens=False,
                                         token_sources=self.enable_prefix_caching)
        self._seqs: dict[int, _Seq] = {}
        self._cpu_free: list[int] = list(range(num_cpu_blocks - 1, -1, -1))  # pop() -> lowest id
        self._ledger = PartialBlockLedger(block_size)
        self._logical = 0  # tokens written, summed over device-resident sequences
        self._key_bytes = 4 * block_size
        self._last_prompt: PromptKeys | None = None  # see _prompt
        # id of read-only ids -> (them, their chain): the last _PROMPT_MEMO asked about
        self._read_only_prompts: dict[int, tuple[np.ndarray, PromptKeys]] = {}
        self.offload: OffloadTiers | None = None  # the lower tiers (attach_offload), or None

    def attach_offload(self, tiers: OffloadTiers) -> None:
        """Give evicted prefix-cache keys to ``tiers`` and look prompts up there after the
        GPU hits (before any sequence is admitted; needs prefix caching)."""
        if not self.enable_prefix_caching:
            raise ValueError("an offload tier holds evicted prefix-cache blocks: enable "
                             "prefix caching to attach one")
        if self._seqs:
            raise ValueError("attach the offload tier before admitting sequences")
        self.offload = tiers
        self.pool.on_evict = tiers.store

    def attach_residency(self, log) -> None:
        """Record every block's transitions in ``log`` (a ``ResidencyLog``)."""
        self.pool.residency = log

    # ---------------------------------------------------------------- queries
    def _get(self, seq_id: int) -> _Seq:
        s = self._seqs.get(seq_id)
        if s is None:
            raise ValueError(f"unknown seq_id {seq_id!r}: admit it (or fork into it) first")
        return s

    def _get_resident(self, seq_id: int, what: str) -> _Seq:
        s = self._get(seq_id)
        if s.cpu_blocks is not None:
            raise ValueError(f"cannot {what} seq {seq_id}: it is swapped out; swap_in it first")
        return s

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def num_tokens(self, seq_id: int) -> int:
        return self._get(seq_id).num_tokens

    def is_swapped(self, seq_id: int) -> bool:
        return self._get(seq_id).cpu_blocks is not None

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the sequence's block table (empty while swapped out)."""
        return list(self._get(seq_id).table)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free)

    @property
    def usage(self) -> float:
        """Fraction of device blocks allocated."""
        return 1.0 - self.pool.num_free / self.num_blocks

    def can_append_without_copy(self, seq_id: int) -> bool:
        """False when the next append must copy a shared, partially filled last block."""
        s = self._get_resident(seq_id, "append to")
        return not (s.num_tokens % self.block_size and self.pool.ref_cnt[s.table[-1]] > 1)

    @property
    def has_shared_partial_blocks(self) -> bool:
        """Whether any partially filled block is shared (only forks share one). O(1)."""
        return self._ledger.num_shared > 0

    def _prompt(self, token_ids: Sequence[int] | np.ndarray) -> PromptKeys:
        """The chain of ``token_ids``' full blocks, memoised: a waiting request is asked
        about (and admitted) with the same ids again, often after other requests.

        NOTE: a read-only array (a request's prompt) is found by identity among the last
        ``_PROMPT_MEMO`` read-only arrays asked about, without comparing its bytes: the
        memo keeps a reference, so the id stays that array's. Other ids are compared by
        bytes with the last chain made or found.
        """
        read_only = isinstance(token_ids, np.ndarray) and not token_ids.flags.writeable
        if read_only:
            seen = self._read_only_prompts.get(id(token_ids))
            if seen is not None:
                self._last_prompt = seen[1]
                return seen[1]
        data = token_bytes(token_ids)
        prompt = self._last_prompt
        if prompt is None or prompt.data != data:
            prompt = PromptKeys(data, self._key_bytes)
            self._last_prompt = prompt
        if read_only:
            memo = self._read_only_prompts
            if len(memo) >= _PROMPT_MEMO:
                del memo[next(iter(memo))]  # the oldest
            memo[id(token_ids)] = (token_ids, prompt)
        return prompt

    def _prefix_hits(self, prompt: PromptKeys, prompt_len: int) -> list[int]:
        """Cached blocks of the longest run of full leading prompt blocks, at most
        ``prompt_len - 1`` tokens (memoised in ``prompt``: do not change the list).
        Changes nothing in the pool.

        NOTE: a block that still holds its key is still that key's block (``register``
        keeps one block per key), so the memoised hits before the first one evicted
        since are still hits, and only the rest of the chain is looked up again.
        """
        pool = self.pool
        hits = prompt.hits
        if hits and prompt.evictions != pool.num_evictions:
            gone = pool.evicted_since(prompt.evictions)
            if gone is None:
                hits.clear()
            else:
                gone = set(gone)
                if not gone.isdisjoint(hits):
                    del hits[list(map(gone.__contains__, hits)).index(True):]
        limit = (prompt_len - 1) // self.block_size
        step = 1
        while len(hits) < limit:  # look up runs of keys until one misses
            i = len(hits)
            j = min(limit, i + step)
            found = pool.lookup_many(prompt.keys(i, j))
            if None in found:
                del found[found.index(None):]
            hits += found
            if len(found) < j - i:
                break
            step = 32  # NOTE: the first key often misses (the memoised frontier): ask it alone
        prompt.evictions = pool.num_evictions
        return hits

    def _lower_hits(self, prompt: PromptKeys, start: int, prompt_len: int) -> int:
        """Prompt blocks from ``start`` (the first GPU miss) on that the offload tier holds,
        as a run, within the same limit as ``_prefix_hits`` (0 without a tier)."""
        if self.offload is None:
            return 0
        limit = (prompt_len - 1) // self.block_size
        return self.offload.match(prompt.keys(start, limit)) if start < limit else 0

    def cached_prefix_tokens(self, prompt_token_ids: Sequence[int]) -> int:
        """Prompt tokens ``admit`` would serve from the prefix cache (and its offload tier)
        now. Changes nothing."""
        if not self.enable_prefix_caching:
            return 0
        prompt_len = len(prompt_token_ids)
        prompt = self._prompt(prompt_token_ids)
        hits = len(self._prefix_hits(prompt, prompt_len))
        return (hits + self._lower_hits(prompt, hits, prompt_len)) * self.block_size

    def prefix_frontier_key(self, prompt_token_ids: Sequence[int]) -> int | None:
        """The cache key of the first prompt block ``admit`` would not find in the cache now,
        or None (no prefix caching, or every block it may reuse is found). The cache
        serves more of this prompt only once a block is registered under that key.
        Changes nothing."""
        if not self.enable_prefix_caching:
            return None
        prompt_len = len(prompt_token_ids)
        prompt = self._prompt(prompt_token_ids)
        i = len(self._prefix_hits(prompt, prompt_len))
        i += self._lower_hits(prompt, i, prompt_len)
        if i >= (prompt_len - 1) // self.block_size:
            return None
        return prompt.keys(i, i + 1)[0]

    def filled_block_keys(self, seq_id: int, token_ids: Sequence[int]) -> list[int]:
        """The cache keys of the blocks that appending ``token_ids`` to ``seq_id`` would
        fill, in order ([] without prefix caching). Changes nothing."""
        s = self._get_resident(seq_id, "look ahead of")
        if not self.enable_prefix_caching:
            return []
        if s.source is not None:
            self._read_tail(s, s.num_tokens)
        data = s.tail.tobytes() + token_bytes(token_ids)
        w = self._key_bytes
        return chain_keys(s.keys[-1] if s.keys else 0, data, 0, len(data) // w, w)

    def fits_empty_pool(self, prompt_len: int, final_len: int) -> bool:
        return -(-final_len // self.block_size) <= self.num_blocks

    def member_slots(self, prompt_len: int, final_len: int) -> int:
        return final_len

    def cached_flags_at_head(self, n: int) -> list[bool]:
        """Whether each of the next ``n`` blocks to be allocated still holds a cache key."""
        return self.pool.cached_flags_at_head(n)

    def slot_mapping(self, seq_id: int, start: int, end: int) -> list[int]:
        s = self._get_resident(seq_id, "map slots of")
        if not 0 <= start <= end <= s.num_tokens:
            raise ValueError(f"slot range [{start}, {end}) is outside the {s.num_tokens} tokens "
                             f"written by seq {seq_id}; append the tokens first")
        bs, table = self.block_size, s.table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def _target(self, s: _Seq, index: int) -> int:
        return min(self.block_size, s.final_len - index * self.block_size)

    def _set_room(self, s: _Seq) -> None:
        """Recompute ``s.room`` (see ``_Seq``) after a change on the general path."""
        n, bs = s.num_tokens, self.block_size
        used = n % bs
        if used and s.cpu_blocks is None and self.pool.ref_cnt[s.table[-1]] == 1:
            s.room = min(bs - 1 - used, s.final_len - n)
        else:
            s.room = 0

    # ----------------------------------------------------------- life cycle
    def can_admit(self, prompt_token_ids: Sequence[int], final_len: int, num_tokens: int) -> bool:
        """Would ``admit`` succeed now? Changes nothing."""
        bs = self.block_size
        # NOTE: admit takes at most the blocks of max(num_tokens, prompt length) tokens,
        # counting the free ones among its hits (it serves at most the prompt's length - 1
        # tokens from the cache): when that many are free it fits, without the prompt's
        # keys and hits (the usual answer after a finish, as most prompts hit nothing)
        if -(-max(num_tokens, len(prompt_token_ids)) // bs) <= self.pool.num_free:
            return True
        hits: list[int] = []
        lower = 0
        if self.enable_prefix_caching:
            prompt = self._prompt(prompt_token_ids)
            hits = self._prefix_hits(prompt, len(prompt_token_ids))
            lower = self._lower_hits(prompt, len(hits), len(prompt_token_ids))
        return self._fits(hits, -(-max(num_tokens, (len(hits) + lower) * bs) // bs) - len(hits))

    def _fits(self, hits: list[int], need: int) -> bool:
        """Whether ``need`` new blocks fit once the ``hits`` are taken: the free ones among
        them leave the free queue. Counts those only when it matters."""
        free = self.pool.num_free
        if need > free:
            return False
        if need <= free - len(hits):
            return True
        return need <= free - list(map(self.pool.ref_cnt.__getitem__, hits)).count(0)

    def admit(self, seq_id: int, prompt_token_ids: Sequence[int], final_len: int,
              num_tokens: int) -> Admission | None:
        """Start ``seq_id``; allocate blocks for its first ``max(num_tokens, cached)`` tokens.

        The engine computes prompt tokens ``[num_cached_tokens, max(num_tokens,
        num_cached_tokens))`` this step. Returns None, changing nothing, when short.
        """
        if seq_id in self._seqs:
            raise ValueError(f"seq_id {seq_id!r} is already admitted: free it first or use a new id")
        prompt_len = len(prompt_token_ids)
        if prompt_len < 1:
            raise ValueError(f"seq {seq_id}: empty prompt; every request needs >= 1 prompt token")
        if final_len < prompt_len:
            raise ValueError(f"seq {seq_id}: final_len {final_len} < prompt length {prompt_len}; "
                             "pass final_len = prompt_len + output_len - 1")
        if not 1 <= num_tokens <= prompt_len:
            raise ValueError(f"seq {seq_id}: num_tokens {num_tokens} must be in [1, {prompt_len}] "
                             "(the prompt tokens to hold after this step)")
        bs, pool = self.block_size, self.pool
        hits: list[int] = []
        prompt = None
        lower = 0  # blocks after the GPU hits found in the offload tier
        if self.enable_prefix_caching:
            prompt = self._prompt(prompt_token_ids)
            hits = self._prefix_hits(prompt, prompt_len)
            lower = self._lower_hits(prompt, len(hits), prompt_len)
        num_cached = (len(hits) + lower) * bs
        n = max(num_tokens, num_cached)
        need = -(-n // bs) - len(hits)
        if not self._fits(hits, need):
            return None
        # Commit. NOTE: touch the hits before allocating so they are not popped for reuse;
        # load the lower-tier run first too, so that the allocation's evictions (stored in
        # the tier) cannot push it out.
        loaded = self.offload.load(prompt.keys(len(hits), len(hits) + lower)) if lower else None
        pool.touch_many(hits)
        keys: list[int] = []
        tail = array("i")
        if prompt is not None:
            full = n // bs
            keys = prompt.keys(0, full)  # NOTE: the hits hold their keys already
            table = hits + pool.allocate_keyed(need, keys[len(hits):])
            tail.frombytes(prompt.data[full * self._key_bytes:n * 4])
        else:
            table = hits + pool.allocate(need)
        s = _Seq(table, n, final_len, prompt_len, keys, tail)
        if prompt is not None and len(keys) < prompt.num_blocks:
            s.known = prompt
        self._seqs[seq_id] = s
        if n % bs:
            last = len(table) - 1
            self._ledger.add_owner(table[last], n - last * bs, self._target(s, last))
            self._set_room(s)
        self._logical += n
        st = self.stats
        st.prefix_queried_tokens += prompt_len
        st.prefix_hit_tokens += num_cached
        if loaded is not None:
            return Admission(num_cached, cpu_hit_tokens=loaded[0] * bs,
                             disk_hit_tokens=loaded[1] * bs)
        return Admission(num_cached_tokens=num_cached)

    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[tuple[int, int]] | None:
        """Make room for ``len(token_ids)`` tokens written this step.

        New blocks are taken only when the last block is full (or would overflow);
        a shared, partially filled last block is copied first: the return value lists
        those ``(src_block, dst_block)`` copies. None (nothing changed) when short.
        """
        s = self._seqs.get(seq_id)
        if s is None:
            self._get(seq_id)  # raises the right error
        k = len(token_ids)
        if 0 < k <= s.room:
            # Fast path: the tokens stay inside the sole-owned partial last block.
            s.room -= k
            s.num_tokens += k
            self._ledger.fill_sum += k
            self._logical += k
            if self.enable_prefix_caching and s.source is None:
                if k == 1 and not isinstance(token_ids, np.ndarray):
                    s.tail.append(token_ids[0])
                else:
                    extend_tokens(s.tail, token_ids)
            return []
        if s.cpu_blocks is not None:
            self._get_resident(seq_id, "append to")  # raises the right error
        n = s.num_tokens
        new_n = n + k
        if new_n > s.final_len:
            raise ValueError(f"seq {seq_id}: appending {k} tokens to {n} exceeds its final_len "
                             f"{s.final_len}; the sequence must end (free it) instead")
        if k == 0:
            return []
        copies = self._grow(s, n, new_n, n % self.block_size)
        if copies is None:
            return None
        s.num_tokens = new_n
        self._logical += k
        if self.enable_prefix_caching:
            tail = s.tail
            if s.source is not None:
                if new_n >= (len(s.keys) + 1) * self.block_size:  # fills a block
                    self._read_tail(s, new_n)
            elif k == 1 and not isinstance(token_ids, np.ndarray):
                tail.append(token_ids[0])
            else:
                extend_tokens(tail, token_ids)
            if len(tail) >= self.block_size:
                self._key_full_blocks(s)
        self._set_room(s)
        return copies

    def append_decode(self, seq_ids: Sequence[int], token_ids: Iterable[int] | None,
                      copies: list[tuple[int, int]]) -> int:
        """One decode step: append ONE token to each sequence, in order.

        Each sequence gets exactly what ``append(seq_id, [token])`` gives it (the same
        blocks, copy-on-write and accounting); its copies are appended to ``copies``.
        Stops at the first sequence that does not fit (nothing changed for it) and
        returns how many leading sequences got their slot (``len(seq_ids)`` = all).
        ``token_ids`` is consumed in step with ``seq_ids`` (one per sequence tried); None
        when none is read (every sequence has a token source, or nothing is keyed).
        The batch form saves a Python call per sequence on the decode hot path.
        NOTE: misuse raises ValueError like ``append``, after committing the sequences
        before the faulty one. The common case (room left in the sole-owned partial last
        block) is done inline, as in ``append_batch``, without a list per token; a token
        that takes a block or fills one waits for ``_grow_together``.
        """
        seqs = self._seqs
        caching = self.enable_prefix_caching
        growing: list[tuple[int, _Seq, Sequence[int], int]] = []  # see _grow_together
        free = self.pool.num_free  # blocks not promised to ``growing``
        in_block = done = 0
        bs, ref_cnt = self.block_size, self.pool.ref_cnt
        try:
            for seq_id, token in zip(seq_ids, repeat(None) if token_ids is None else token_ids):
                s = seqs.get(seq_id)
                if s is not None and s.room:
                    s.room -= 1
                    s.num_tokens += 1
                    in_block += 1
                    if caching and s.source is None:
                        s.tail.append(token)
                elif (s is not None and s.cpu_blocks is None and s.known is None
                      and (n := s.num_tokens) < s.final_len
                      and not (n % bs and ref_cnt[s.table[-1]] > 1)):
                    # a token that takes or fills a block: queued (see _grow_together)
                    need = -(-(n + 1) // bs) - len(s.table)
                    if need > free:
                        break
                    growing.append((seq_id, s, (token,), need))
                    free -= need
                else:
                    free = self._append_general(seq_id, (token,), growing, copies)
                    if free < 0:
                        break
                done += 1
        finally:
            self._count_inline(in_block)
            self._grow_together(growing)
        return done

    def append_batch(self, seq_ids: Sequence[int], token_lists: Sequence[Sequence[int]],
                     copies: list[tuple[int, int]]) -> int:
        """``append(seq_id, tokens)`` for each pair in order, in one call; copy-on-write
        copies go to ``copies``. Stops at the first sequence that does not fit (nothing
        changed for it) and returns how many leading sequences got their tokens.
        NOTE: the common case (the tokens stay inside the sole-owned partial last block)
        is done inline; appends that take or fill blocks without a copy are committed
        together (``_grow_together``); everything else goes through ``append``.
        """
        seqs = self._seqs
        caching = self.enable_prefix_caching
        growing: list[tuple[int, _Seq, Sequence[int], int]] = []  # see _grow_together
        free = self.pool.num_free  # blocks not promised to ``growing``
        in_block = 0  # tokens appended on the inline path
        done = 0
        ndarray = np.ndarray
        bs, ref_cnt = self.block_size, self.pool.ref_cnt
        try:
            for seq_id, tokens in zip(seq_ids, token_lists):
                s = seqs.get(seq_id)
                k = len(tokens)
                if s is not None and 0 < k <= s.room:
                    s.room -= k
                    s.num_tokens += k
                    in_block += k
                    if caching and s.source is None:
                        if isinstance(tokens, ndarray):
                            extend_tokens(s.tail, tokens)
                        elif k == 1:
                            s.tail.append(tokens[0])
                        else:  # a range (a span's synthetic tokens) or a list
                            s.tail.extend(tokens)
                elif (s is not None and s.cpu_blocks is None and s.known is None
                      and k and (n := s.num_tokens) + k <= s.final_len
                      and not (n % bs and ref_cnt[s.table[-1]] > 1)):
                    # tokens that take or fill blocks: queued (see _grow_together)
                    need = -(-(n + k) // bs) - len(s.table)
                    if need > free:
                        break
                    growing.append((seq_id, s, tokens, need))
                    free -= need
                else:
                    free = self._append_general(seq_id, tokens, growing, copies)
                    if free < 0:
                        break
                done += 1
        finally:
            self._count_inline(in_block)
            self._grow_together(growing)
        return done

    def _count_inline(self, tokens: int) -> None:
        """Account for ``tokens`` written inside sole-owned partial last blocks (the batch
        forms' inline path): they change no block, only the written-slot sums."""
        self._ledger.fill_sum += tokens
        self._logical += tokens

    def _append_general(self, seq_id: int, tokens: Sequence[int],
                        growing: list[tuple[int, _Seq, Sequence[int], int]],
                        copies: list[tuple[int, int]]) -> int:
        """A batch form's append that ``_grow_together`` may not do, committed through
        ``append`` after the queued ``growing`` ones; its copies go to ``copies``. Returns
        the free blocks after it, or -1 (nothing changed for it) when short."""
        self._grow_together(growing)
        grown = self.append(seq_id, tokens)
        if grown is None:
            return -1
        copies.extend(grown)
        return self.pool.num_free

    def _grow_together(self, growing: list[tuple[int, _Seq, Sequence[int], int]]) -> None:
        """Commit ``growing``'s appends ``(seq_id, seq, tokens, new blocks)`` exactly as
        ``append`` one after the other would, with one allocation for all their new blocks
        and one registration of the blocks they fill; empties ``growing``. The batch forms
        queue (all fitting) the appends of resident sequences within their final_len whose
        partial last block (if any) is their own (no copy-on-write) and whose prompt keys
        are all used (``known``).

        NOTE: the allocation pops the blocks in the order the appends would, so block ids,
        evictions and residency times are the same. Registering the filled blocks after
        every allocation instead of between them changes nothing unless the allocation
        evicts the very key one of them gets; such a key is cached now, so then all the
        appends go through ``append`` (never in practice: decode keys are new).
        """
        if not growing:
            return
        bs, pool = self.block_size, self.pool
        caching = self.enable_prefix_caching
        filling: list[list[int] | None] = []  # [len(growing)] the keys of the blocks each fills
        total = 0  # the new blocks, all appends together
        if caching:
            w, ndarray = self._key_bytes, np.ndarray
            fresh: list[int] = []
            for _, s, tokens, need in growing:
                total += need
                tail, keys = s.tail, s.keys
                if s.source is not None:  # NOTE: _read_tail inlined (the decode hot path)
                    end = s.num_tokens + len(tokens)
                    keyed = len(keys) * bs
                    if end < keyed + bs:  # fills no block: no ids to read yet
                        filling.append(None)
                        continue
                    # NOTE: only the ids of the blocks filled are read, so the tail is
                    # empty after them (it lags behind) and the next fill's bytes are the
                    # source's own, hashed without a round trip through the tail
                    full = end - end % bs
                    data = s.source(keyed + len(tail), full)
                    if tail:
                        data = tail.tobytes() + data
                    count = (full - keyed) // bs
                else:
                    if isinstance(tokens, ndarray):
                        extend_tokens(tail, tokens)
                    else:  # a range, list or tuple
                        tail.extend(tokens)
                    count = len(tail) // bs
                    if not count:
                        filling.append(None)
                        continue
                    data = tail.tobytes()
                parent = keys[-1] if keys else 0
                if count == 1:  # chain_keys inlined (the decode hot path)
                    new = [(parent * MUL + hash(data[:w])) & MASK]
                else:
                    new = chain_keys(parent, data, 0, count, w)
                filling.append(new)
                fresh += new
            if fresh and pool.holds_any(fresh):
                for _, s, _, _ in growing:  # undo the tails' extensions
                    del s.tail[s.num_tokens - len(s.keys) * bs:]
                for seq_id, _, tokens, _ in growing:
                    self.append(seq_id, tokens)  # fits (counted), sole-owned: no copies
                growing.clear()
                return
        else:
            filling = [None] * len(growing)
            total = sum([entry[3] for entry in growing])
        blocks = pool.allocate(total) if total else []  # [total]
        # NOTE: every partial last block here is sole-owned (as queued), so the ledger's
        # ``sole`` entries are replaced in place (the one stored is the target it had) and
        # its sums change once
        ledger = self._ledger
        sole = ledger.sole
        partial_change = target_change = 0  # partial blocks and their targets, after - before
        filled: list[int] = []  # the blocks filled, in order, and their keys
        filled_keys: list[int] = []
        taken = written = 0
        for (_, s, tokens, need), new in zip(growing, filling):
            table, n, final = s.table, s.num_tokens, s.final_len
            k = len(tokens)
            if n % bs:
                target_change -= sole.pop(table[-1])
                partial_change -= 1
            if need == 1:
                table.append(blocks[taken])
                taken += 1
            elif need:
                table += blocks[taken:taken + need]
                taken += need
            n += k
            s.num_tokens = n
            written += k
            used = n % bs
            if used:
                target = final - n + used
                if target > bs:
                    target = bs
                sole[table[-1]] = target
                target_change += target
                partial_change += 1
                room = final - n
                s.room = room if room < bs - 1 - used else bs - 1 - used  # _set_room: its own block
            else:
                s.room = 0
            if new is not None:
                keys = s.keys
                first = len(keys)
                filled += table[first:first + len(new)]
                filled_keys += new
                keys += new
                del s.tail[:len(new) * bs]
        # the written slots, less those of the blocks completed (need - after + before each)
        ledger.fill_sum += written - bs * (total - partial_change)
        ledger.target_sum += target_change
        ledger.count += partial_change
        pool.register_many(filled, filled_keys)
        self._logical += written
        growing.clear()

    def _grow(self, s: _Seq, n: int, new_n: int, used: int) -> list[tuple[int, int]] | None:
        """Blocks (and a copy-on-write) for growing ``s`` from ``n`` to ``new_n`` tokens."""
        bs, pool, table, ledger = self.block_size, self.pool, s.table, self._ledger
        last = len(table) - 1
        cow = 1 if used and pool.ref_cnt[table[last]] > 1 else 0
        need = -(-new_n // bs) - len(table)
        if need + cow > pool.num_free:
            return None
        copies = []
        if used:  # NOTE: self._target inlined here and below (the decode hot path)
            ledger.remove_owner(table[last], used, min(bs, s.final_len - last * bs))
        if cow:
            src = table[last]
            dst = pool.allocate(1)[0]
            pool.free((src,))
            table[last] = dst
            copies.append((src, dst))
            self.stats.cow_copies += 1
        if need:
            table.extend(pool.allocate(need))
        if new_n % bs:
            last = len(table) - 1
            ledger.add_owner(table[last], new_n - last * bs, min(bs, s.final_len - last * bs))
        return copies

    def set_token_source(self, seq_id: int, source: Callable[[int, int], bytes]) -> None:
        """From now on read ``seq_id``'s token ids from ``source(start, end)`` (the ids at
        positions ``[start, end)``, of tokens it holds, as packed 4-byte ints: the bytes
        keys hash) when a block fills: its appends' ids are then only counted (they may be
        None in ``append_decode``). Needs prefix caching (``Capabilities.token_sources``);
        the engine gives each sequence it admits or forks its ``Sequence.token_run``.

        NOTE: the decode path then builds no ids: the tail lags behind the tokens written
        until a block fills, and reading its ids then gives the same bytes, so the same keys.
        """
        s = self._get(seq_id)
        if not self.enable_prefix_caching:
            raise ValueError("a token source feeds prefix-cache keys: enable prefix caching")
        s.source = source

    def _read_tail(self, s: _Seq, end: int) -> None:
        """Extend the tail of ``s`` (which has a token source) with the ids it lacks of the
        tokens before position ``end``, read from the source."""
        start = len(s.keys) * self.block_size + len(s.tail)
        if start < end:
            s.tail.frombytes(s.source(start, end))

    def _key_full_blocks(self, s: _Seq) -> None:
        """Key and register the blocks the tail buffer has filled."""
        tail, keys = s.tail, s.keys
        first = len(keys)
        count = len(tail) // self.block_size
        data = tail.tobytes()
        if count == 1 and s.known is None:
            # The decode hot path: one block; chain_keys inlined.
            key = ((keys[-1] if keys else 0) * MUL + hash(data[:self._key_bytes])) & MASK
            self.pool.register(s.table[first], key)
            keys.append(key)
            del tail[:self.block_size]
            return
        new = self._known_keys(s, data, count) if s.known is not None else []
        if len(new) < count:
            before = new or keys
            w = self._key_bytes
            new += chain_keys(before[-1] if before else 0, data, len(new) * w, count - len(new), w)
        self.pool.register_many(s.table[first:first + count], new)
        keys += new
        del tail[:count * self.block_size]

    def _known_keys(self, s: _Seq, data: bytes, count: int) -> list[int]:
        """The precomputed keys (``s.known``, not None) of the next ``count`` blocks to
        key, whose tokens are ``data``, as far as they reach; forgets ``s.known`` once
        used up."""
        known = s.known
        first, w = len(s.keys), self._key_bytes
        left = known.num_blocks - first
        m = min(count, left)
        if m == left:
            s.known = None  # the last of its full blocks is keyed now
        if known.data[first * w:(first + m) * w] != data[:m * w]:
            s.known = None  # not the admitted tokens (the engine never does that): key them
            return []
        return known.keys(first, first + m)

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[tuple[int, int]]:
        """``child_id`` shares all of the parent's blocks; never needs memory, returns []."""
        p = self._get_resident(parent_id, "fork")
        if child_id in self._seqs:
            raise ValueError(f"child seq_id {child_id!r} already exists: fork into a new id")
        if final_len < p.num_tokens:
            raise ValueError(f"child final_len {final_len} < the {p.num_tokens} tokens it "
                             f"inherits from seq {parent_id}")
        if p.source is not None:  # the child's ids up to here are the parent's
            self._read_tail(p, p.num_tokens)
        c = _Seq(list(p.table), p.num_tokens, final_len, p.prompt_len, list(p.keys),
                 array("i", p.tail))
        c.known = p.known
        self._seqs[child_id] = c
        self.pool.touch_many(c.table)
        p.room = 0  # NOTE: its last block is shared now: the next append may copy it
        if c.num_tokens % self.block_size:
            last = len(c.table) - 1
            self._ledger.add_owner(c.table[last], c.num_tokens - last * self.block_size,
                                   self._target(c, last))
        self._logical += c.num_tokens
        return []

    def _release_device(self, s: _Seq) -> None:
        if s.num_tokens % self.block_size:
            last = len(s.table) - 1
            self._ledger.remove_owner(s.table[last], s.num_tokens - last * self.block_size,
                                      self._target(s, last))
        self._logical -= s.num_tokens
        self.pool.free(s.table[::-1])  # NOTE: tail first, so the tail is evicted first
        s.table = []
        s.room = 0

    def free(self, seq_id: int) -> None:
        s = self._get(seq_id)
        del self._seqs[seq_id]
        if s.cpu_blocks is not None:
            self._cpu_free.extend(reversed(s.cpu_blocks))
            return
        self._release_device(s)

    def swap_out(self, seq_id: int) -> list[tuple[int, int]] | None:
        """Copy every block to the CPU pool and free it on the device: ``[(device, cpu)]``."""
        s = self._get_resident(seq_id, "swap out")
        m = len(s.table)
        if m > len(self._cpu_free):
            return None
        cpu = [self._cpu_free.pop() for _ in range(m)]
        mapping = list(zip(s.table, cpu))
        self._release_device(s)
        s.cpu_blocks = cpu
        self.stats.swap_outs += 1
        self.stats.swapped_out_units += m
        return mapping

    def swap_in(self, seq_id: int) -> list[tuple[int, int]] | None:
        """Bring a swapped sequence back into fresh device blocks: ``[(cpu, device)]``.

        Its full blocks are re-registered in the prefix cache when their key is free.
        Sharing with a fork sibling is not restored (each swap-in gets its own blocks).
        """
        s = self._get(seq_id)
        cpu = s.cpu_blocks
        if cpu is None:
            raise ValueError(f"seq {seq_id} is not swapped out; only swap_in after swap_out")
        table = self.pool.allocate(len(cpu))
        if table is None:
            return None
        s.table = table
        s.cpu_blocks = None
        self._cpu_free.extend(reversed(cpu))
        self.pool.register_many(table[:len(s.keys)], s.keys)
        bs = self.block_size
        if s.num_tokens % bs:
            last = len(table) - 1
            self._ledger.add_owner(table[last], s.num_tokens - last * bs, self._target(s, last))
        self._logical += s.num_tokens
        self._set_room(s)
        self.stats.swap_ins += 1
        self.stats.swapped_in_units += len(cpu)
        return list(zip(cpu, table))

    # ------------------------------------------------------------ accounting
    def breakdown(self, memory_blocked: bool) -> MemoryBreakdown:
        """O(1). See ``pagebench.allocators.accounting`` for how shared partial blocks count.

        NOTE: ``make_breakdown``'s figures, built positionally (the engine asks once per
        step and once per fast-forward span)."""
        bs, pool = self.block_size, self.pool
        allocated = (self.num_blocks - pool.num_free) * bs
        token_states, reserved, rounding = self._ledger.slots(allocated)
        free = self.capacity_slots - allocated
        return MemoryBreakdown(
            self.capacity_slots, token_states, reserved, 0, rounding,
            free if memory_blocked else 0, 0 if memory_blocked else free,
            self._logical, allocated, pool.num_free * bs, pool.num_cached_free * bs)
