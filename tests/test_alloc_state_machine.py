"""Hypothesis state machines: random admit / append / fork / free / swap on each manager,
checked after every step against a reference model of what every slot holds."""

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from allocators import ContiguousKVCacheManager, PagedKVCacheManager

SETTINGS = settings(max_examples=40, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
ALPHABET = st.integers(0, 2)  # few distinct ids, so prompts share prefixes and blocks repeat
PREFIXES = [[], [1] * 8, [1, 2, 0, 1, 2, 0, 1, 2, 0, 1], [2, 2, 2, 2, 0, 0, 0, 0, 1]]


def check_breakdown_sums(m, expected):
    for blocked in (False, True):
        b = m.breakdown(blocked)
        total = (b.token_states + b.reserved + b.internal_fragmentation
                 + b.external_fragmentation + b.idle)
        assert total == b.capacity_slots == m.capacity_slots
        got = {k: getattr(b, k) for k in expected}
        assert got == expected
        assert b.free_slots == b.capacity_slots - b.allocated_slots
        assert (b.external_fragmentation if blocked else b.idle) == b.free_slots


# --------------------------------------------------------------------- paged
class PagedMachine(RuleBasedStateMachine):
    BS, NUM_BLOCKS, NUM_CPU = 4, 12, 6
    caching = True

    def __init__(self):
        super().__init__()
        self.m = PagedKVCacheManager(self.NUM_BLOCKS, self.BS, num_cpu_blocks=self.NUM_CPU,
                                     enable_prefix_caching=self.caching)
        self.seqs = {}  # id -> {"prompt", "tokens", "final", "cpu"}
        self.content = [[None] * self.BS for _ in range(self.NUM_BLOCKS)]  # device slots
        self.cpu = {}  # cpu block -> tokens
        self.history = []  # tokens of freed sequences
        self.next_id = 0

    def resident(self):
        return sorted(s for s, v in self.seqs.items() if v["cpu"] is None)

    def swapped(self):
        return sorted(s for s, v in self.seqs.items() if v["cpu"] is not None)

    def write(self, sid, start, tokens):
        slots = self.m.slot_mapping(sid, start, start + len(tokens))
        for slot, t in zip(slots, tokens):
            self.content[slot // self.BS][slot % self.BS] = t

    def next_tokens(self, seq, k, data):
        n = len(seq["tokens"])
        if n < len(seq["prompt"]):  # a later prefill chunk
            return list(seq["prompt"][n:n + k])
        return data.draw(st.lists(ALPHABET, min_size=k, max_size=k))

    @rule(data=st.data())
    def admit(self, data):
        # Prompts often continue a shared prefix or an earlier sequence (a next chat turn),
        # so that prefix hits, including on decode-produced blocks, are common.
        heads = PREFIXES + self.history[-4:]
        prompt = data.draw(st.sampled_from(heads)) + data.draw(st.lists(ALPHABET, max_size=10))
        prompt = prompt[:24] or [0]
        final = len(prompt) + data.draw(st.integers(0, 12))
        num = data.draw(st.integers(1, len(prompt)))
        sid, self.next_id = self.next_id, self.next_id + 1
        as_array = data.draw(st.booleans())
        res = self.m.admit(sid, np.array(prompt, np.int32) if as_array else prompt, final, num)
        if res is None:
            assert sid not in self.m
            return
        c = res.num_cached_tokens
        assert c % self.BS == 0 and c <= len(prompt) - 1
        if not self.caching:
            assert c == 0
        n = max(num, c)
        self.seqs[sid] = {"prompt": prompt, "tokens": prompt[:n], "final": final, "cpu": None}
        self.write(sid, c, prompt[c:n])  # cached slots must already hold prompt[:c]

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def append(self, data):
        sid = data.draw(st.sampled_from(self.resident()))
        seq = self.seqs[sid]
        n, room = len(seq["tokens"]), seq["final"] - len(seq["tokens"])
        if room == 0:
            with pytest.raises(ValueError):
                self.m.append(sid, [0])
            return
        k = data.draw(st.integers(1, min(room, 2 * self.BS)))
        toks = self.next_tokens(seq, k, data)
        table = self.m.block_table(sid)
        last_shared = n % self.BS and self.m.pool.ref_cnt[table[-1]] > 1
        need = -(-(n + len(toks)) // self.BS) - len(table) + bool(last_shared)
        copies = self.m.append(sid, np.array(toks, np.int32) if k > 1 else toks)
        if copies is None:
            assert need > self.m.num_free_blocks
            assert self.m.block_table(sid) == table and self.m.num_tokens(sid) == n
            return
        assert len(copies) == bool(last_shared)
        for src, dst in copies:
            assert table[-1] == src
            self.content[dst] = list(self.content[src])
        seq["tokens"] = seq["tokens"] + toks
        self.write(sid, n, toks)

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def append_batch(self, data):
        """Several tokens each for several sequences in one call: ``append`` one by one,
        stopping at the first that does not fit."""
        open_ids = [s for s in self.resident() if self.seqs[s]["final"] > len(self.seqs[s]["tokens"])]
        if not open_ids:
            return
        sids = data.draw(st.lists(st.sampled_from(open_ids), min_size=1, unique=True))
        toks = []
        for sid in sids:
            seq = self.seqs[sid]
            k = data.draw(st.integers(1, min(seq["final"] - len(seq["tokens"]), 2 * self.BS)))
            toks.append(self.next_tokens(seq, k, data))
        before = {sid: (self.m.block_table(sid), len(self.seqs[sid]["tokens"])) for sid in sids}
        copies = []
        done = self.m.append_batch(sids, toks, copies)
        assert 0 <= done <= len(sids)
        expected_copies = []
        for i, sid in enumerate(sids):
            table, n = before[sid]
            if i < done:
                new_table = self.m.block_table(sid)
                if n % self.BS and new_table[len(table) - 1] != table[-1]:
                    expected_copies.append((table[-1], new_table[len(table) - 1]))
                seq = self.seqs[sid]
                seq["tokens"] = seq["tokens"] + toks[i]
            else:
                assert self.m.block_table(sid) == table and self.m.num_tokens(sid) == n
        assert copies == expected_copies
        for src, dst in copies:
            self.content[dst] = list(self.content[src])
        for i, sid in enumerate(sids[:done]):
            self.write(sid, before[sid][1], toks[i])

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def append_decode(self, data):
        """One token each for several sequences in one call: the same as ``append`` one by
        one, stopping at the first that does not fit."""
        open_ids = [s for s in self.resident() if self.seqs[s]["final"] > len(self.seqs[s]["tokens"])]
        if not open_ids:
            return
        sids = data.draw(st.lists(st.sampled_from(open_ids), min_size=1, unique=True))
        toks = [self.next_tokens(self.seqs[sid], 1, data) for sid in sids]
        before = {sid: (self.m.block_table(sid), len(self.seqs[sid]["tokens"])) for sid in sids}
        copies = []
        done = self.m.append_decode(sids, (t[0] for t in toks), copies)
        assert 0 <= done <= len(sids)
        expected_copies = []
        for i, sid in enumerate(sids):
            table, n = before[sid]
            if i < done:
                if n % self.BS and self.m.pool.ref_cnt[table[-1]] >= 1 and \
                        self.m.block_table(sid)[-1] != table[-1]:
                    expected_copies.append((table[-1], self.m.block_table(sid)[-1]))
                seq = self.seqs[sid]
                seq["tokens"] = seq["tokens"] + toks[i]
            elif i == done:  # out of memory: nothing changed for it
                assert self.m.block_table(sid) == table and self.m.num_tokens(sid) == n
                shared = n % self.BS and self.m.pool.ref_cnt[table[-1]] > 1
                need = -(-(n + 1) // self.BS) - len(table) + bool(shared)
                assert need > self.m.num_free_blocks
            else:
                assert self.m.num_tokens(sid) == n
        assert copies == expected_copies
        for src, dst in copies:
            self.content[dst] = list(self.content[src])
        for i, sid in enumerate(sids[:done]):
            self.write(sid, before[sid][1], toks[i])

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.resident()))
        p = self.seqs[parent]
        final = len(p["tokens"]) + data.draw(st.integers(0, 10))
        sid, self.next_id = self.next_id, self.next_id + 1
        assert self.m.fork(parent, sid, final) == []
        self.seqs[sid] = {"prompt": p["prompt"], "tokens": list(p["tokens"]), "final": final,
                          "cpu": None}

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        self.m.free(sid)
        seq = self.seqs.pop(sid)
        self.history.append(seq["tokens"])
        for b in seq["cpu"] or ():
            del self.cpu[b]
        assert sid not in self.m

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def swap_out(self, data):
        sid = data.draw(st.sampled_from(self.resident()))
        table = self.m.block_table(sid)
        mapping = self.m.swap_out(sid)
        if mapping is None:
            assert len(table) > self.NUM_CPU - len(self.cpu)
            return
        assert [d for d, _ in mapping] == table
        for dev, cpu in mapping:
            assert cpu not in self.cpu
            self.cpu[cpu] = list(self.content[dev])
        self.seqs[sid]["cpu"] = [c for _, c in mapping]

    @precondition(lambda self: self.swapped())
    @rule(data=st.data())
    def swap_in(self, data):
        sid = data.draw(st.sampled_from(self.swapped()))
        seq = self.seqs[sid]
        mapping = self.m.swap_in(sid)
        if mapping is None:
            assert len(seq["cpu"]) > self.m.num_free_blocks and self.m.is_swapped(sid)
            return
        assert [c for c, _ in mapping] == seq["cpu"]
        for cpu, dev in mapping:
            self.content[dev] = self.cpu.pop(cpu)
        seq["cpu"] = None

    @invariant()
    def blocks_refcounts_and_contents_agree_with_the_model(self):
        m, bs = self.m, self.BS
        owners = {}
        for sid in self.resident():
            seq, table = self.seqs[sid], m.block_table(sid)
            n = len(seq["tokens"])
            assert m.num_tokens(sid) == n and len(table) == -(-n // bs)
            assert len(set(table)) == len(table)
            for b in table:
                owners[b] = owners.get(b, 0) + 1
            for p, t in enumerate(seq["tokens"]):
                assert self.content[table[p // bs]][p % bs] == t, (sid, p)
        queue = m.pool.free_queue()
        assert len(queue) == len(set(queue)) == m.num_free_blocks
        assert set(queue) == {b for b in range(self.NUM_BLOCKS) if b not in owners}
        for b in range(self.NUM_BLOCKS):
            assert m.pool.ref_cnt[b] == owners.get(b, 0)
        assert len(owners) + m.num_free_blocks == self.NUM_BLOCKS
        shared_partial = any(len(self.seqs[sid]["tokens"]) % bs and owners[m.block_table(sid)[-1]] > 1
                             for sid in self.resident())
        assert m.has_shared_partial_blocks == shared_partial
        assert len(self.cpu) + m.num_free_cpu_blocks == self.NUM_CPU
        for b in range(self.NUM_BLOCKS):  # a registered block holds exactly its key's tokens
            key = m.pool.key_of(b)
            if key is not None:
                assert np.array(self.content[b], np.int32).tobytes() == key[1]
        if not self.caching:
            assert m.pool.num_cached_blocks == 0

    @invariant()
    def breakdown_matches_a_from_scratch_recomputation(self):
        m, bs = self.m, self.BS
        fill, target = {}, {}
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
        check_breakdown_sums(m, {
            "token_states": sum(fill.values()),
            "reserved": sum(target[b] - fill[b] for b in fill),
            "internal_over_reservation": 0,
            "internal_rounding": sum(bs - target[b] for b in fill),
            "allocated_slots": len(fill) * bs,
            "logical_tokens": logical,
            "largest_free_extent": len(queue) * bs,
            "cached_free_slots": cached_free * bs,
        })


class PagedNoCachingMachine(PagedMachine):
    caching = False


TestPagedWithPrefixCaching = PagedMachine.TestCase
TestPagedWithPrefixCaching.settings = SETTINGS
TestPagedWithoutPrefixCaching = PagedNoCachingMachine.TestCase
TestPagedWithoutPrefixCaching.settings = SETTINGS


# ---------------------------------------------------------------- contiguous
def expected_reservation(policy, prompt_len, final_len, max_model_len):
    if policy == "max":
        return max_model_len
    if policy == "oracle":
        return final_len
    out = final_len - prompt_len + 1
    p2 = 1
    while p2 < out:
        p2 *= 2
    return min(max_model_len, prompt_len + p2 - 1)


class ContiguousMachine(RuleBasedStateMachine):
    CAPACITY, MAX_LEN, NUM_CPU = 200, 48, 60  # 200 = buddy roots 128 + 64 + 8
    policy, arena = "pow2", "buddy"

    def __init__(self):
        super().__init__()
        self.m = ContiguousKVCacheManager(self.CAPACITY, policy=self.policy, arena=self.arena,
                                          max_model_len=self.MAX_LEN, num_cpu_slots=self.NUM_CPU)
        self.seqs = {}  # id -> {"prompt_len", "tokens", "final", "swapped"}
        self.slots = {}  # device slot -> token
        self.cpu_tokens = {}  # id -> tokens while swapped
        self.next_id = 0

    def resident(self):
        return sorted(s for s, v in self.seqs.items() if not v["swapped"])

    def swapped(self):
        return sorted(s for s, v in self.seqs.items() if v["swapped"])

    def taken(self, size):
        return 1 << (size - 1).bit_length() if self.arena == "buddy" else size

    def expect_placement(self, sid, prompt_len, final):
        start, length = self.m.slot_range(sid)
        assert length == expected_reservation(self.policy, prompt_len, final, self.MAX_LEN)
        assert self.m.arena.size_of(start) == self.taken(length)
        return start

    def write(self, sid, start, tokens):
        for slot, t in zip(self.m.slot_mapping(sid, start, start + len(tokens)), tokens):
            self.slots[slot] = t

    @rule(data=st.data())
    def admit(self, data):
        plen = data.draw(st.integers(1, 20))
        final = plen + data.draw(st.integers(0, self.MAX_LEN - plen))
        num = data.draw(st.integers(1, plen))
        toks = data.draw(st.lists(ALPHABET, min_size=num, max_size=num))
        sid, self.next_id = self.next_id, self.next_id + 1
        res = self.m.admit(sid, [0] * plen, final, num)
        want = self.taken(expected_reservation(self.policy, plen, final, self.MAX_LEN))
        if res is None:
            assert self.m.arena.largest_free_extent() < want and sid not in self.m
            return
        assert res.num_cached_tokens == 0
        self.expect_placement(sid, plen, final)
        self.seqs[sid] = {"prompt_len": plen, "tokens": toks, "final": final, "swapped": False}
        self.write(sid, 0, toks)

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def append(self, data):
        sid = data.draw(st.sampled_from(self.resident()))
        seq = self.seqs[sid]
        room = seq["final"] - len(seq["tokens"])
        if room == 0:
            with pytest.raises(ValueError):
                self.m.append(sid, [0])
            return
        k = data.draw(st.integers(1, min(room, 8)))
        toks = data.draw(st.lists(ALPHABET, min_size=k, max_size=k))
        assert self.m.append(sid, toks) == []
        n = len(seq["tokens"])
        seq["tokens"] = seq["tokens"] + toks
        self.write(sid, n, toks)

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def append_batch(self, data):
        """Several tokens each for several sequences in one call; never short, no copies."""
        open_ids = [s for s in self.resident() if self.seqs[s]["final"] > len(self.seqs[s]["tokens"])]
        if not open_ids:
            return
        sids = data.draw(st.lists(st.sampled_from(open_ids), min_size=1, unique=True))
        toks = [data.draw(st.lists(ALPHABET, min_size=1,
                                   max_size=self.seqs[sid]["final"] - len(self.seqs[sid]["tokens"])))
                for sid in sids]
        copies = []
        assert self.m.append_batch(sids, toks, copies) == len(sids) and copies == []
        for sid, tok in zip(sids, toks):
            seq = self.seqs[sid]
            n = len(seq["tokens"])
            seq["tokens"] = seq["tokens"] + tok
            self.write(sid, n, tok)

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def append_decode(self, data):
        """One token each for several sequences in one call; never short, no copies."""
        open_ids = [s for s in self.resident() if self.seqs[s]["final"] > len(self.seqs[s]["tokens"])]
        if not open_ids:
            return
        sids = data.draw(st.lists(st.sampled_from(open_ids), min_size=1, unique=True))
        toks = data.draw(st.lists(ALPHABET, min_size=len(sids), max_size=len(sids)))
        copies = []
        assert self.m.append_decode(sids, toks, copies) == len(sids) and copies == []
        for sid, tok in zip(sids, toks):
            seq = self.seqs[sid]
            n = len(seq["tokens"])
            seq["tokens"] = seq["tokens"] + [tok]
            self.write(sid, n, [tok])

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.resident()))
        p = self.seqs[parent]
        n = len(p["tokens"])
        final = n + data.draw(st.integers(0, max(0, self.MAX_LEN - n)))
        final = max(final, p["prompt_len"])
        sid, self.next_id = self.next_id, self.next_id + 1
        copies = self.m.fork(parent, sid, final)
        want = self.taken(expected_reservation(self.policy, p["prompt_len"], final, self.MAX_LEN))
        if copies is None:
            assert self.m.arena.largest_free_extent() < want and sid not in self.m
            return
        pstart, _ = self.m.slot_range(parent)
        cstart = self.expect_placement(sid, p["prompt_len"], final)
        assert copies == [(pstart + i, cstart + i) for i in range(n)]
        for src, dst in copies:
            self.slots[dst] = self.slots[src]
        self.seqs[sid] = {"prompt_len": p["prompt_len"], "tokens": list(p["tokens"]),
                          "final": final, "swapped": False}

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        self.m.free(sid)
        self.seqs.pop(sid)
        self.cpu_tokens.pop(sid, None)

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def swap_out(self, data):
        sid = data.draw(st.sampled_from(self.resident()))
        seq = self.seqs[sid]
        start, _ = self.m.slot_range(sid)
        mapping = self.m.swap_out(sid)
        if mapping is None:
            assert self.m._cpu.largest_free_extent() < len(seq["tokens"])
            return
        assert [d for d, _ in mapping] == list(range(start, start + len(seq["tokens"])))
        self.cpu_tokens[sid] = [self.slots[d] for d, _ in mapping]
        seq["swapped"] = True

    @precondition(lambda self: self.swapped())
    @rule(data=st.data())
    def swap_in(self, data):
        sid = data.draw(st.sampled_from(self.swapped()))
        seq = self.seqs[sid]
        mapping = self.m.swap_in(sid)
        want = self.taken(expected_reservation(self.policy, seq["prompt_len"], seq["final"],
                                               self.MAX_LEN))
        if mapping is None:
            assert self.m.arena.largest_free_extent() < want and self.m.is_swapped(sid)
            return
        start = self.expect_placement(sid, seq["prompt_len"], seq["final"])
        assert [d for _, d in mapping] == list(range(start, start + len(seq["tokens"])))
        for (_, d), t in zip(mapping, self.cpu_tokens.pop(sid)):
            self.slots[d] = t
        seq["swapped"] = False

    @invariant()
    def extents_are_disjoint_and_hold_the_written_tokens(self):
        m = self.m
        used = []
        for sid in self.resident():
            start, length = m.slot_range(sid)
            used.append((start, m.arena.size_of(start)))
            toks = self.seqs[sid]["tokens"]
            assert m.num_tokens(sid) == len(toks)
            assert [self.slots[start + i] for i in range(len(toks))] == toks
        free = m.arena.free_extents()
        spans = sorted(used + free)
        pos = 0
        for start, length in spans:  # allocated + free extents tile the arena exactly
            assert start == pos and length > 0
            pos += length
        assert pos == self.CAPACITY
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

    @invariant()
    def breakdown_matches_a_from_scratch_recomputation(self):
        written = final = res = taken = 0
        for sid in self.resident():
            seq = self.seqs[sid]
            r = expected_reservation(self.policy, seq["prompt_len"], seq["final"], self.MAX_LEN)
            written += len(seq["tokens"])
            final += seq["final"]
            res += r
            taken += self.taken(r)
        check_breakdown_sums(self.m, {
            "token_states": written, "reserved": final - written,
            "internal_over_reservation": res - final, "internal_rounding": taken - res,
            "allocated_slots": taken, "logical_tokens": written, "cached_free_slots": 0,
        })


_CONTIGUOUS_CASES = [(p, a) for p in ("max", "pow2", "oracle")
                     for a in ("buddy", "first_fit", "best_fit")]
for _policy, _arena in _CONTIGUOUS_CASES:
    _machine = type(f"Contiguous_{_policy}_{_arena}", (ContiguousMachine,),
                    {"policy": _policy, "arena": _arena})
    _case = _machine.TestCase
    _case.settings = settings(SETTINGS, max_examples=12, stateful_step_count=25)
    globals()[f"TestContiguous_{_policy}_{_arena}"] = _case
del _policy, _arena, _machine, _case
