"""Reference models of the KV managers for the random-operation tests.

A model wraps a manager and mirrors what every slot should hold. Each operation takes
its random choices as arguments (the hypothesis state machines in
test_alloc_state_machine.py draw them, the long drivers in test_property_long.py take
them from a seeded ``random.Random``), performs the manager call, asserts what it must
return, and updates the mirror; ``check()`` compares the manager with the mirror in full.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import numpy as np
import pytest

from pagebench.allocators.registry import ContiguousKVCacheManager, PagedKVCacheManager

from pagebench.allocators import prefix_keys


def check_breakdown(manager, expected: dict | None = None) -> None:
    """The breakdown partitions the pool exactly (both blocked states), and its fields
    equal ``expected`` where given."""
    for blocked in (False, True):
        b = manager.breakdown(blocked)
        assert (b.token_states + b.reserved + b.internal_fragmentation + b.external_fragmentation
                + b.idle) == b.capacity_slots == manager.capacity_slots
        assert min(b.token_states, b.reserved, b.internal_over_reservation, b.internal_rounding,
                   b.external_fragmentation, b.idle) >= 0
        assert b.free_slots == b.capacity_slots - b.allocated_slots
        assert (b.external_fragmentation if blocked else b.idle) == b.free_slots
        if expected is not None:
            assert {k: getattr(b, k) for k in expected} == expected


def expected_reservation(policy: str, prompt_len: int, final_len: int, max_len: int) -> int:
    """Slots a contiguous policy reserves for a sequence (before allocator rounding)."""
    if policy == "max":
        return max_len
    if policy == "oracle":
        return final_len
    return min(max_len, prompt_len + (1 << (final_len - prompt_len).bit_length()) - 1)


class _Model(ABC):
    """Bookkeeping shared by both models: the reference sequences by id.

    ``seqs[id]``: ``prompt`` and ``tokens`` (lists), ``final`` (length when done) and
    ``swapped``; ``resident()`` and ``swapped()`` list ids in admission order.
    """

    m: PagedKVCacheManager | ContiguousKVCacheManager

    def __init__(self) -> None:
        self.seqs: dict[int, dict] = {}
        self.next_id = 0

    def new_id(self) -> int:
        sid, self.next_id = self.next_id, self.next_id + 1
        return sid

    def resident(self) -> list[int]:
        return sorted(s for s, v in self.seqs.items() if not v["swapped"])

    def swapped(self) -> list[int]:
        return sorted(s for s, v in self.seqs.items() if v["swapped"])

    def room(self, sid: int) -> int:
        """Tokens the sequence may still append."""
        return self.seqs[sid]["final"] - len(self.seqs[sid]["tokens"])

    def open_ids(self) -> list[int]:
        """Resident sequences that may still append."""
        return [s for s in self.resident() if self.room(s)]

    def next_tokens(self, sid: int, k: int, random_tokens: Callable[[int], list[int]]) -> list[int]:
        """The next ``k`` tokens of a sequence: its prompt's (a later prefill chunk) or new ones."""
        seq = self.seqs[sid]
        n = len(seq["tokens"])
        if n < len(seq["prompt"]):
            return list(seq["prompt"][n:n + k])
        return random_tokens(k)

    def refuse_append_when_full(self, sid: int) -> None:
        assert self.room(sid) == 0
        with pytest.raises(ValueError):
            self.m.append(sid, [0])

    @abstractmethod
    def write(self, sid: int, start: int, tokens: list[int]) -> None:
        """Record ``tokens``, written at positions ``start``.., in the model's copy of the KV."""

    def _extend(self, sid: int, tokens: list[int]) -> None:
        seq = self.seqs[sid]
        n = len(seq["tokens"])
        seq["tokens"] = seq["tokens"] + tokens
        self.write(sid, n, tokens)


def reference_chain_key(tokens: tuple, bs: int) -> int:
    """The prefix-cache key of the block that ends ``tokens`` (``pagebench.allocators.prefix_keys``)."""
    key = 0
    for start in range(0, len(tokens), bs):
        block = np.array(tokens[start:start + bs], np.int32).tobytes()
        key = (key * prefix_keys.MUL + hash(block)) % 2**64
    return key


class PagedModel(_Model):
    """A ``PagedKVCacheManager`` and the tokens every device block and CPU block holds."""

    def __init__(self, num_blocks: int, block_size: int, num_cpu: int, caching: bool) -> None:
        super().__init__()
        self.bs, self.num_blocks, self.num_cpu = block_size, num_blocks, num_cpu
        self.caching = caching
        self.m = PagedKVCacheManager(num_blocks, block_size, num_cpu_blocks=num_cpu,
                                     enable_prefix_caching=caching)
        self.content = [[None] * block_size for _ in range(num_blocks)]  # device slots
        self.cpu: dict[int, list] = {}  # cpu block -> tokens
        self.history: list[list[int]] = []  # tokens of freed sequences
        self.prefix_of: dict[int, tuple] = {}  # full block -> its sequence's tokens up to its end

    def write(self, sid: int, start: int, tokens: list[int]) -> None:
        bs, written = self.bs, self.seqs[sid]["tokens"]
        for p, slot, t in zip(range(start, start + len(tokens)),
                              self.m.slot_mapping(sid, start, start + len(tokens)), tokens):
            self.content[slot // bs][slot % bs] = t
            if (p + 1) % bs == 0:
                self.prefix_of[slot // bs] = tuple(written[:p + 1])

    def admit(self, prompt: list[int], final: int, num: int, *, as_array: bool = False) -> None:
        bs, sid = self.bs, self.new_id()
        res = self.m.admit(sid, np.array(prompt, np.int32) if as_array else prompt, final, num)
        if res is None:
            assert sid not in self.m
            return
        c = res.num_cached_tokens
        assert c % bs == 0 and c <= len(prompt) - 1 and (self.caching or c == 0)
        table = self.m.block_table(sid)
        for p in range(c):  # a prefix hit must hold exactly the prompt's tokens
            assert self.content[table[p // bs]][p % bs] == prompt[p], (sid, p)
        n = max(num, c)
        self.seqs[sid] = {"prompt": prompt, "tokens": prompt[:n], "final": final, "swapped": False,
                          "cpu": None}
        self.write(sid, c, prompt[c:n])

    def _blocks_needed(self, sid: int, table: list[int], n: int, k: int) -> tuple[int, bool]:
        """(new blocks ``k`` more tokens need, whether the last block is shared: copy-on-write)."""
        last_shared = bool(n % self.bs) and self.m.pool.ref_cnt[table[-1]] > 1
        return -(-(n + k) // self.bs) - len(table) + last_shared, last_shared

    def append(self, sid: int, toks: list[int], *, as_array: bool = False) -> None:
        n, table = len(self.seqs[sid]["tokens"]), self.m.block_table(sid)
        need, last_shared = self._blocks_needed(sid, table, n, len(toks))
        copies = self.m.append(sid, np.array(toks, np.int32) if as_array else toks)
        if copies is None:
            assert need > self.m.num_free_blocks
            assert self.m.block_table(sid) == table and self.m.num_tokens(sid) == n
            return
        assert len(copies) == last_shared
        for src, dst in copies:
            assert table[-1] == src
            self.content[dst] = list(self.content[src])
        self._extend(sid, toks)

    def append_many(self, sids: list[int], toks: list[list[int]], *, decode: bool) -> None:
        """``append_decode`` (one token each) or ``append_batch``: the same as ``append`` one
        by one, stopping at the first that does not fit."""
        before = {sid: (self.m.block_table(sid), len(self.seqs[sid]["tokens"])) for sid in sids}
        copies: list[tuple[int, int]] = []
        if decode:
            done = self.m.append_decode(sids, (t[0] for t in toks), copies)
        else:
            done = self.m.append_batch(sids, toks, copies)
        assert 0 <= done <= len(sids)
        expected_copies = []
        for i, sid in enumerate(sids):
            table, n = before[sid]
            if i < done:
                new_table = self.m.block_table(sid)
                if n % self.bs and new_table[len(table) - 1] != table[-1]:
                    expected_copies.append((table[-1], new_table[len(table) - 1]))
                continue
            assert self.m.block_table(sid) == table and self.m.num_tokens(sid) == n
            if i == done:  # out of memory: nothing changed for it
                assert self._blocks_needed(sid, table, n, len(toks[i]))[0] > self.m.num_free_blocks
        assert copies == expected_copies
        for src, dst in copies:
            self.content[dst] = list(self.content[src])
        for sid, tokens in zip(sids[:done], toks):
            self._extend(sid, tokens)

    def fork(self, parent: int, final: int) -> None:
        p, sid = self.seqs[parent], self.new_id()
        assert self.m.fork(parent, sid, final) == []
        self.seqs[sid] = {"prompt": p["prompt"], "tokens": list(p["tokens"]), "final": final,
                          "swapped": False, "cpu": None}

    def free(self, sid: int) -> None:
        self.m.free(sid)
        seq = self.seqs.pop(sid)
        self.history.append(seq["tokens"])
        for b in seq["cpu"] or ():
            del self.cpu[b]
        assert sid not in self.m

    def swap_out(self, sid: int) -> None:
        table = self.m.block_table(sid)
        mapping = self.m.swap_out(sid)
        if mapping is None:
            assert len(table) > self.num_cpu - len(self.cpu)
            return
        assert [d for d, _ in mapping] == table
        for dev, cpu in mapping:
            assert cpu not in self.cpu
            self.cpu[cpu] = list(self.content[dev])
        self.seqs[sid].update(swapped=True, cpu=[c for _, c in mapping])

    def swap_in(self, sid: int) -> None:
        seq = self.seqs[sid]
        mapping = self.m.swap_in(sid)
        if mapping is None:
            assert len(seq["cpu"]) > self.m.num_free_blocks and self.m.is_swapped(sid)
            return
        assert [c for c, _ in mapping] == seq["cpu"]
        for i, (cpu, dev) in enumerate(mapping):
            self.content[dev] = self.cpu.pop(cpu)
            if (i + 1) * self.bs <= len(seq["tokens"]):
                self.prefix_of[dev] = tuple(seq["tokens"][:(i + 1) * self.bs])
        seq.update(swapped=False, cpu=None)

    def check(self) -> None:
        """Everything the mirror determines: blocks, ref counts, contents, breakdown."""
        self.check_blocks()
        self.check_breakdown()

    def check_blocks(self) -> None:
        """Block tables, free queue, ref counts, slot contents and the prefix-cache keys."""
        m, bs = self.m, self.bs
        owners: dict[int, int] = {}
        for sid in self.resident():
            seq, table = self.seqs[sid], m.block_table(sid)
            n = len(seq["tokens"])
            assert m.num_tokens(sid) == n and len(table) == -(-n // bs)
            assert len(set(table)) == len(table)  # no block twice in one table
            for b in table:
                owners[b] = owners.get(b, 0) + 1
            for p, t in enumerate(seq["tokens"]):
                assert self.content[table[p // bs]][p % bs] == t, (sid, p)
        queue = m.pool.free_queue()
        assert len(queue) == len(set(queue)) == m.num_free_blocks
        assert set(queue) == {b for b in range(self.num_blocks) if b not in owners}
        for b in range(self.num_blocks):
            assert m.pool.ref_cnt[b] == owners.get(b, 0)  # ref counts equal owners
        assert len(owners) + m.num_free_blocks == self.num_blocks  # used + free = capacity
        shared_partial = any(len(self.seqs[sid]["tokens"]) % bs
                             and owners[m.block_table(sid)[-1]] > 1 for sid in self.resident())
        assert m.has_shared_partial_blocks == shared_partial
        assert len(self.cpu) + m.num_free_cpu_blocks == self.num_cpu
        for b in range(self.num_blocks):  # a registered block's key is its prefix's chain hash
            key = m.pool.key_of(b)
            if key is not None:
                prefix = self.prefix_of[b]
                assert list(prefix[-bs:]) == self.content[b]
                assert key == reference_chain_key(prefix, bs)
        if not self.caching:
            assert m.pool.num_cached_blocks == 0

    def check_breakdown(self) -> None:
        """The memory breakdown equals a from-scratch recomputation from the mirror."""
        m, bs = self.m, self.bs
        fill: dict[int, int] = {}
        target: dict[int, int] = {}
        logical = 0
        for sid in self.resident():
            seq, table = self.seqs[sid], m.block_table(sid)
            n = len(seq["tokens"])
            logical += n
            for i, b in enumerate(table):
                f = min(bs, n - i * bs)
                assert fill.setdefault(b, f) == f  # owners of a block agree on its fill
                target[b] = max(target.get(b, 0), min(bs, seq["final"] - i * bs))
        queue = m.pool.free_queue()
        cached_free = sum(1 for b in queue if m.pool.key_of(b) is not None)
        check_breakdown(m, {
            "token_states": sum(fill.values()),
            "reserved": sum(target[b] - fill[b] for b in fill),
            "internal_over_reservation": 0,
            "internal_rounding": sum(bs - target[b] for b in fill),
            "allocated_slots": len(fill) * bs,
            "logical_tokens": logical,
            "largest_free_extent": len(queue) * bs,
            "cached_free_slots": cached_free * bs,
        })


class ContiguousModel(_Model):
    """A ``ContiguousKVCacheManager`` and the token every device slot holds."""

    def __init__(self, capacity: int, policy: str, arena: str, num_cpu: int, max_len: int) -> None:
        super().__init__()
        self.capacity, self.policy, self.arena, self.max_len = capacity, policy, arena, max_len
        self.m = ContiguousKVCacheManager(capacity, policy=policy, arena=arena,
                                          max_model_len=max_len, num_cpu_slots=num_cpu)
        self.slots: dict[int, int] = {}  # device slot -> token
        self.cpu_tokens: dict[int, list] = {}  # id -> tokens while swapped

    def taken(self, size: int) -> int:
        """Slots the arena takes for a reservation of ``size``."""
        return 1 << (size - 1).bit_length() if self.arena == "buddy" else size

    def wanted(self, prompt_len: int, final: int) -> int:
        return self.taken(expected_reservation(self.policy, prompt_len, final, self.max_len))

    def placed(self, sid: int) -> int:
        """Check the sequence's reservation; return its first slot."""
        seq = self.seqs[sid]
        start, length = self.m.slot_range(sid)
        want = expected_reservation(self.policy, len(seq["prompt"]), seq["final"], self.max_len)
        assert length == want and self.m.arena.size_of(start) == self.taken(want)
        return start

    def write(self, sid: int, start: int, tokens: list[int]) -> None:
        for slot, t in zip(self.m.slot_mapping(sid, start, start + len(tokens)), tokens):
            self.slots[slot] = t

    def admit(self, prompt: list[int], final: int, num: int) -> None:
        sid = self.new_id()
        res = self.m.admit(sid, prompt, final, num)
        if res is None:
            assert self.m.arena.largest_free_extent() < self.wanted(len(prompt), final)
            assert sid not in self.m
            return
        assert res.num_cached_tokens == 0
        self.seqs[sid] = {"prompt": prompt, "tokens": prompt[:num], "final": final,
                          "swapped": False}
        self.placed(sid)
        self.write(sid, 0, prompt[:num])

    def append(self, sid: int, toks: list[int]) -> None:
        assert self.m.append(sid, toks) == []
        self._extend(sid, toks)

    def append_many(self, sids: list[int], toks: list[list[int]], *, decode: bool) -> None:
        """``append_decode`` (one token each) or ``append_batch``: never short, no copies."""
        copies: list[tuple[int, int]] = []
        if decode:
            done = self.m.append_decode(sids, [t[0] for t in toks], copies)
        else:
            done = self.m.append_batch(sids, toks, copies)
        assert done == len(sids) and copies == []
        for sid, tokens in zip(sids, toks):
            self._extend(sid, tokens)

    def fork(self, parent: int, final: int) -> None:
        p, sid = self.seqs[parent], self.new_id()
        n = len(p["tokens"])
        copies = self.m.fork(parent, sid, final)
        if copies is None:
            assert self.m.arena.largest_free_extent() < self.wanted(len(p["prompt"]), final)
            assert sid not in self.m
            return
        self.seqs[sid] = {"prompt": p["prompt"], "tokens": list(p["tokens"]), "final": final,
                          "swapped": False}
        pstart, _ = self.m.slot_range(parent)
        cstart = self.placed(sid)
        assert copies == [(pstart + i, cstart + i) for i in range(n)]
        for src, dst in copies:
            self.slots[dst] = self.slots[src]

    def free(self, sid: int) -> None:
        self.m.free(sid)
        self.seqs.pop(sid)
        self.cpu_tokens.pop(sid, None)
        assert sid not in self.m

    def swap_out(self, sid: int) -> None:
        seq = self.seqs[sid]
        start, _ = self.m.slot_range(sid)
        mapping = self.m.swap_out(sid)
        if mapping is None:
            cpu = self.m._cpu  # None without CPU slots
            assert (cpu.largest_free_extent() if cpu is not None else 0) < len(seq["tokens"])
            return
        assert [d for d, _ in mapping] == list(range(start, start + len(seq["tokens"])))
        self.cpu_tokens[sid] = [self.slots[d] for d, _ in mapping]
        seq["swapped"] = True

    def swap_in(self, sid: int) -> None:
        seq = self.seqs[sid]
        mapping = self.m.swap_in(sid)
        if mapping is None:
            want = self.wanted(len(seq["prompt"]), seq["final"])
            assert self.m.arena.largest_free_extent() < want and self.m.is_swapped(sid)
            return
        start = self.placed(sid)
        assert [d for _, d in mapping] == list(range(start, start + len(seq["tokens"])))
        for (_, d), t in zip(mapping, self.cpu_tokens.pop(sid)):
            self.slots[d] = t
        seq["swapped"] = False

    def check(self) -> None:
        """Everything the mirror determines: extents, contents, breakdown."""
        self.check_extents()
        self.check_breakdown()

    def check_extents(self) -> None:
        """Extents are disjoint, tile the arena with the free ones, hold the written tokens;
        free extents are coalesced."""
        m = self.m
        used = []
        for sid in self.resident():
            start, _ = m.slot_range(sid)
            used.append((start, m.arena.size_of(start)))
            toks = self.seqs[sid]["tokens"]
            assert m.num_tokens(sid) == len(toks)
            assert [self.slots[start + i] for i in range(len(toks))] == toks
        free = m.arena.free_extents()
        pos = 0
        for start, length in sorted(used + free):  # allocated + free extents tile the arena
            assert start == pos and length > 0
            pos += length
        assert pos == self.capacity
        assert m.arena.free_slots == sum(length for _, length in free)
        assert m.arena.largest_free_extent() == max((length for _, length in free), default=0)
        if self.arena == "buddy":
            free_set = set(free)
            for start, length in free:
                assert start % length == 0
                assert (start ^ length, length) not in free_set  # buddies coalesced
        else:
            for (s1, l1), (s2, _) in zip(free, free[1:]):
                assert s1 + l1 < s2  # neighbours coalesced

    def check_breakdown(self) -> None:
        """The memory breakdown equals a from-scratch recomputation from the mirror."""
        written = final = res = taken = 0
        for sid in self.resident():
            seq = self.seqs[sid]
            r = expected_reservation(self.policy, len(seq["prompt"]), seq["final"], self.max_len)
            written += len(seq["tokens"])
            final += seq["final"]
            res += r
            taken += self.taken(r)
        check_breakdown(self.m, {
            "token_states": written, "reserved": final - written,
            "internal_over_reservation": res - final, "internal_rounding": taken - res,
            "allocated_slots": taken, "logical_tokens": written, "cached_free_slots": 0,
        })
