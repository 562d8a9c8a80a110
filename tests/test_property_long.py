"""Long random-operation runs of the KV managers against a reference model (>= 10^5 ops in
this file alone), and mutation fuzzing of the trace parsers with real file heads.

The hypothesis state machines in test_alloc_state_machine.py shrink well but are slow per
operation; here hypothesis draws a seed and a pool shape, and a direct driver performs
``OPS_PER_EXAMPLE`` random admit / append / fork / free / swap operations, checking the
cheap invariants after every operation and the full reference model every ``FULL_EVERY``
operations and at the end. A failure reports the seed, so it replays exactly.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from allocators import ContiguousKVCacheManager, PagedKVCacheManager
from harness.errors import ConfigError, InputError
from harness.workloads import build_workload

OPS_PER_EXAMPLE = 1000
FULL_EVERY = 50
PAGED_EXAMPLES = 30  # x 2 (prefix caching on / off) x 1,000 ops = 60,000 ops
CONTIGUOUS_EXAMPLES = 45  # x 1,000 ops = 45,000 ops
OPS = ("admit", "append", "append", "append", "fork", "free", "swap_out", "swap_in")


def check_sums(manager) -> None:
    """O(1) after every operation: the breakdown partitions the pool exactly."""
    for blocked in (False, True):
        b = manager.breakdown(blocked)
        assert (b.token_states + b.reserved + b.internal_fragmentation + b.external_fragmentation
                + b.idle) == b.capacity_slots == manager.capacity_slots
        assert min(b.token_states, b.reserved, b.internal_over_reservation, b.internal_rounding,
                   b.external_fragmentation, b.idle) >= 0
        assert b.free_slots == b.capacity_slots - b.allocated_slots
        assert (b.external_fragmentation if blocked else b.idle) == b.free_slots


class _Driver:
    """Shared bookkeeping: the reference sequences and the op dispatch."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seqs: dict[int, dict] = {}  # id -> {"prompt", "tokens", "final", "swapped"}
        self.next_id = 0
        self.ops = 0

    def resident(self) -> list[int]:
        return [s for s, v in self.seqs.items() if not v["swapped"]]

    def swapped(self) -> list[int]:
        return [s for s, v in self.seqs.items() if v["swapped"]]

    def run(self, num_ops: int) -> None:
        for i in range(num_ops):
            op = self.rng.choice(OPS)
            if op != "admit" and not (self.swapped() if op == "swap_in" else
                                      self.seqs if op == "free" else self.resident()):
                op = "admit"
            getattr(self, op)()
            self.ops += 1
            check_sums(self.m)
            if i % FULL_EVERY == FULL_EVERY - 1:
                self.full_check()
        self.full_check()

    def next_tokens(self, seq: dict, k: int) -> list[int]:
        n = len(seq["tokens"])
        if n < len(seq["prompt"]):  # a later prefill chunk
            return list(seq["prompt"][n:n + k])
        return [self.rng.randrange(4) for _ in range(k)]


class PagedDriver(_Driver):
    def __init__(self, seed: int, num_blocks: int, block_size: int, caching: bool,
                 num_cpu: int) -> None:
        super().__init__(seed)
        self.bs, self.num_blocks, self.num_cpu, self.caching = block_size, num_blocks, num_cpu, caching
        self.m = PagedKVCacheManager(num_blocks, block_size, enable_prefix_caching=caching,
                                     num_cpu_blocks=num_cpu)
        self.content = [[None] * block_size for _ in range(num_blocks)]
        self.cpu: dict[int, list] = {}
        # a few stems so that prompts share long prefixes and the cache hits
        self.stems = [[self.rng.randrange(4) for _ in range(6 * block_size)] for _ in range(3)]

    def write(self, sid: int, start: int, tokens: list[int]) -> None:
        for slot, t in zip(self.m.slot_mapping(sid, start, start + len(tokens)), tokens):
            self.content[slot // self.bs][slot % self.bs] = t

    def admit(self) -> None:
        rng, bs = self.rng, self.bs
        stem = rng.choice(self.stems)[:rng.randrange(0, 6 * bs)]
        prompt = stem + [rng.randrange(4) for _ in range(rng.randrange(1, 3 * bs))]
        final = len(prompt) + rng.randrange(0, 4 * bs)
        num = rng.randint(1, len(prompt))
        sid, self.next_id = self.next_id, self.next_id + 1
        res = self.m.admit(sid, prompt, final, num)
        if res is None:
            assert sid not in self.m
            return
        c = res.num_cached_tokens
        assert c % bs == 0 and c <= len(prompt) - 1 and (self.caching or c == 0)
        n = max(num, c)
        table = self.m.block_table(sid)
        for p in range(c):  # a prefix hit must hold exactly the prompt's tokens
            assert self.content[table[p // bs]][p % bs] == prompt[p], (sid, p)
        self.seqs[sid] = {"prompt": prompt, "tokens": prompt[:n], "final": final, "swapped": False}
        self.write(sid, c, prompt[c:n])

    def append(self) -> None:
        sid = self.rng.choice(self.resident())
        seq = self.seqs[sid]
        n, room = len(seq["tokens"]), seq["final"] - len(seq["tokens"])
        if room == 0:
            with pytest.raises(ValueError):
                self.m.append(sid, [0])
            return
        toks = self.next_tokens(seq, self.rng.randint(1, min(room, 2 * self.bs)))
        table = self.m.block_table(sid)
        copies = self.m.append(sid, toks)
        if copies is None:
            assert self.m.block_table(sid) == table and self.m.num_tokens(sid) == n
            return
        for src, dst in copies:
            assert src == table[-1]
            self.content[dst] = list(self.content[src])
        seq["tokens"] = seq["tokens"] + toks
        self.write(sid, n, toks)

    def fork(self) -> None:
        parent = self.rng.choice(self.resident())
        p = self.seqs[parent]
        sid, self.next_id = self.next_id, self.next_id + 1
        final = len(p["tokens"]) + self.rng.randrange(0, 3 * self.bs)
        assert self.m.fork(parent, sid, final) == []
        self.seqs[sid] = {"prompt": p["prompt"], "tokens": list(p["tokens"]), "final": final,
                          "swapped": False}

    def free(self) -> None:
        sid = self.rng.choice(list(self.seqs))
        seq = self.seqs.pop(sid)
        if seq["swapped"]:
            for b in seq["cpu"]:
                del self.cpu[b]
        self.m.free(sid)
        assert sid not in self.m

    def swap_out(self) -> None:
        sid = self.rng.choice(self.resident())
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

    def swap_in(self) -> None:
        sid = self.rng.choice(self.swapped())
        seq = self.seqs[sid]
        mapping = self.m.swap_in(sid)
        if mapping is None:
            assert self.m.is_swapped(sid)
            return
        assert [c for c, _ in mapping] == seq["cpu"]
        for cpu, dev in mapping:
            self.content[dev] = self.cpu.pop(cpu)
        seq["swapped"] = False

    def full_check(self) -> None:
        m, bs = self.m, self.bs
        owners: dict[int, int] = {}
        fill: dict[int, int] = {}
        target: dict[int, int] = {}
        logical = 0
        for sid in self.resident():
            seq, table = self.seqs[sid], m.block_table(sid)
            n = len(seq["tokens"])
            logical += n
            assert m.num_tokens(sid) == n and len(table) == -(-n // bs)
            assert len(set(table)) == len(table)  # no block twice in one table
            for i, b in enumerate(table):
                owners[b] = owners.get(b, 0) + 1
                f = min(bs, n - i * bs)
                assert fill.setdefault(b, f) == f
                target[b] = max(target.get(b, 0), min(bs, seq["final"] - i * bs))
            for p, t in enumerate(seq["tokens"]):
                assert self.content[table[p // bs]][p % bs] == t, (sid, p)
        queue = m.pool.free_queue()
        assert len(queue) == len(set(queue)) == m.num_free_blocks
        assert set(queue).isdisjoint(owners)
        assert len(owners) + m.num_free_blocks == self.num_blocks  # used + free = capacity
        for b in range(self.num_blocks):
            assert m.pool.ref_cnt[b] == owners.get(b, 0)  # ref counts equal owners
        assert len(self.cpu) + m.num_free_cpu_blocks == self.num_cpu
        b = m.breakdown(False)
        assert (b.token_states, b.reserved, b.internal_rounding, b.internal_over_reservation,
                b.allocated_slots, b.logical_tokens) == (
            sum(fill.values()), sum(target[k] - fill[k] for k in fill),
            sum(bs - target[k] for k in fill), 0, len(fill) * bs, logical)


def expected_reservation(policy: str, prompt_len: int, final_len: int, max_len: int) -> int:
    if policy == "max":
        return max_len
    if policy == "oracle":
        return final_len
    return min(max_len, prompt_len + (1 << (final_len - prompt_len).bit_length()) - 1)


class ContiguousDriver(_Driver):
    def __init__(self, seed: int, capacity: int, policy: str, arena: str, num_cpu: int,
                 max_len: int) -> None:
        super().__init__(seed)
        self.capacity, self.policy, self.arena, self.max_len = capacity, policy, arena, max_len
        self.m = ContiguousKVCacheManager(capacity, policy=policy, arena=arena,
                                          max_model_len=max_len, num_cpu_slots=num_cpu)
        self.slots: dict[int, int] = {}
        self.cpu_tokens: dict[int, list] = {}

    def taken(self, size: int) -> int:
        return 1 << (size - 1).bit_length() if self.arena == "buddy" else size

    def placed(self, sid: int, seq: dict) -> int:
        start, length = self.m.slot_range(sid)
        want = expected_reservation(self.policy, len(seq["prompt"]), seq["final"], self.max_len)
        assert length == want and self.m.arena.size_of(start) == self.taken(want)
        return start

    def write(self, sid: int, start: int, tokens: list[int]) -> None:
        for slot, t in zip(self.m.slot_mapping(sid, start, start + len(tokens)), tokens):
            self.slots[slot] = t

    def admit(self) -> None:
        rng = self.rng
        plen = rng.randint(1, self.max_len // 2)
        prompt = [rng.randrange(4) for _ in range(plen)]
        final = plen + rng.randrange(0, self.max_len - plen + 1)
        num = rng.randint(1, plen)
        sid, self.next_id = self.next_id, self.next_id + 1
        res = self.m.admit(sid, prompt, final, num)
        if res is None:
            want = self.taken(expected_reservation(self.policy, plen, final, self.max_len))
            assert self.m.arena.largest_free_extent() < want and sid not in self.m
            return
        seq = {"prompt": prompt, "tokens": prompt[:num], "final": final, "swapped": False}
        self.placed(sid, seq)
        self.seqs[sid] = seq
        self.write(sid, 0, prompt[:num])

    def append(self) -> None:
        sid = self.rng.choice(self.resident())
        seq = self.seqs[sid]
        room = seq["final"] - len(seq["tokens"])
        if room == 0:
            with pytest.raises(ValueError):
                self.m.append(sid, [0])
            return
        toks = self.next_tokens(seq, self.rng.randint(1, min(room, 16)))
        assert self.m.append(sid, toks) == []
        n = len(seq["tokens"])
        seq["tokens"] = seq["tokens"] + toks
        self.write(sid, n, toks)

    def fork(self) -> None:
        parent = self.rng.choice(self.resident())
        p = self.seqs[parent]
        n = len(p["tokens"])
        final = max(len(p["prompt"]), n + self.rng.randrange(0, max(1, self.max_len - n + 1)))
        sid, self.next_id = self.next_id, self.next_id + 1
        copies = self.m.fork(parent, sid, final)
        seq = {"prompt": p["prompt"], "tokens": list(p["tokens"]), "final": final, "swapped": False}
        if copies is None:
            want = self.taken(expected_reservation(self.policy, len(p["prompt"]), final, self.max_len))
            assert self.m.arena.largest_free_extent() < want and sid not in self.m
            return
        pstart, _ = self.m.slot_range(parent)
        cstart = self.placed(sid, seq)
        assert copies == [(pstart + i, cstart + i) for i in range(n)]
        for src, dst in copies:
            self.slots[dst] = self.slots[src]
        self.seqs[sid] = seq

    def free(self) -> None:
        sid = self.rng.choice(list(self.seqs))
        self.seqs.pop(sid)
        self.cpu_tokens.pop(sid, None)
        self.m.free(sid)

    def swap_out(self) -> None:
        sid = self.rng.choice(self.resident())
        seq = self.seqs[sid]
        start, _ = self.m.slot_range(sid)
        mapping = self.m.swap_out(sid)
        if mapping is None:
            return
        assert [d for d, _ in mapping] == list(range(start, start + len(seq["tokens"])))
        self.cpu_tokens[sid] = [self.slots[d] for d, _ in mapping]
        seq["swapped"] = True

    def swap_in(self) -> None:
        sid = self.rng.choice(self.swapped())
        seq = self.seqs[sid]
        mapping = self.m.swap_in(sid)
        if mapping is None:
            assert self.m.is_swapped(sid)
            return
        start = self.placed(sid, seq)
        assert [d for _, d in mapping] == list(range(start, start + len(seq["tokens"])))
        for (_, d), t in zip(mapping, self.cpu_tokens.pop(sid)):
            self.slots[d] = t
        seq["swapped"] = False

    def full_check(self) -> None:
        m = self.m
        used = []
        written = final = reserved = taken = 0
        for sid in self.resident():
            seq = self.seqs[sid]
            start, _ = m.slot_range(sid)
            used.append((start, m.arena.size_of(start)))
            assert m.num_tokens(sid) == len(seq["tokens"])
            assert [self.slots[start + i] for i in range(len(seq["tokens"]))] == seq["tokens"]
            r = expected_reservation(self.policy, len(seq["prompt"]), seq["final"], self.max_len)
            written, final = written + len(seq["tokens"]), final + seq["final"]
            reserved, taken = reserved + r, taken + self.taken(r)
        pos = 0
        for start, length in sorted(used + m.arena.free_extents()):  # extents tile the arena
            assert start == pos and length > 0
            pos += length
        assert pos == self.capacity
        b = m.breakdown(False)
        assert (b.token_states, b.reserved, b.internal_over_reservation, b.internal_rounding,
                b.allocated_slots, b.logical_tokens) == (
            written, final - written, reserved - final, taken - reserved, taken, written)


SLOW = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))


@settings(SLOW, max_examples=PAGED_EXAMPLES)
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.integers(4, 48),
       block_size=st.sampled_from([1, 2, 4, 8, 16]), num_cpu=st.integers(0, 24))
@pytest.mark.parametrize("caching", [True, False], ids=["prefix_cache", "no_cache"])
def test_paged_manager_survives_long_random_operation_runs(caching, seed, num_blocks, block_size,
                                                          num_cpu):
    driver = PagedDriver(seed, num_blocks, block_size, caching, num_cpu)
    driver.run(OPS_PER_EXAMPLE)
    assert driver.ops == OPS_PER_EXAMPLE


@settings(SLOW, max_examples=CONTIGUOUS_EXAMPLES)
@given(seed=st.integers(0, 2**32 - 1), capacity=st.integers(64, 600),
       policy=st.sampled_from(["max", "pow2", "oracle"]),
       arena=st.sampled_from(["buddy", "first_fit", "best_fit"]), num_cpu=st.integers(0, 200),
       max_len=st.sampled_from([16, 48, 64]))
def test_contiguous_manager_survives_long_random_operation_runs(seed, capacity, policy, arena,
                                                               num_cpu, max_len):
    driver = ContiguousDriver(seed, capacity, policy, arena, num_cpu, max_len)
    driver.run(OPS_PER_EXAMPLE)
    assert driver.ops == OPS_PER_EXAMPLE


def test_the_suite_performs_at_least_1e5_random_operations():
    total = OPS_PER_EXAMPLE * (2 * PAGED_EXAMPLES + CONTIGUOUS_EXAMPLES)
    assert total >= 100_000


# ------------------------------------------------- trace parser mutation fuzzing
CONF = Path(__file__).resolve().parents[1] / "conf" / "workload"
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
SAMPLES = {  # preset -> (file in ../shared/traces, suffix, lines kept from its head)
    "azure_conv": ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", ".csv", 12),
    "mooncake": ("mooncake_fast25_conversation/conversation_trace.jsonl", ".jsonl", 6),
}
FALLBACK = {  # used when ../shared/traces is absent
    "azure_conv": "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
                  "2023-11-16 18:15:51.3200000,879,29\n",
    "mooncake": '{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": '
                '[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}\n'
                '{"timestamp": 29, "input_length": 1024, "output_length": 9, "hash_ids": [0, 1]}\n',
}


def preset_node(preset: str, path: Path, **overrides) -> dict:
    """The workload node of a conf/workload preset (``# @package _global_`` ones nest it)."""
    node = OmegaConf.to_container(OmegaConf.load(CONF / f"{preset}.yaml"))
    node = node.get("workload", node)
    node.update(path=str(path), **overrides)
    return node


def _sample(preset: str) -> bytes:
    rel, _, lines = SAMPLES[preset]
    path = TRACES / rel
    if not path.exists():
        return FALLBACK[preset].encode()
    with path.open("rb") as handle:
        return b"".join(handle.readline() for _ in range(lines))


MUTATIONS = st.lists(st.tuples(st.sampled_from(["truncate", "delete", "insert", "flip",
                                                "dup_line", "drop_line", "swap_lines"]),
                               st.integers(0, 10**6), st.binary(min_size=1, max_size=4)),
                     min_size=1, max_size=5)
INTERESTING = [b",", b"\n", b'"', b"{", b"}", b"[", b"]", b":", b"-", b"0", b"9" * 25, b"\xff",
               b"\x00", b"NaN", b"e5", b" ", b"\r"]


def mutate(data: bytes, mutations, rng: random.Random) -> bytes:
    for kind, pos, blob in mutations:
        if rng.random() < 0.5:
            blob = rng.choice(INTERESTING)
        at = pos % (len(data) + 1)
        lines = data.split(b"\n")
        if kind == "truncate":
            data = data[:at]
        elif kind == "delete":
            data = data[:at] + data[at + len(blob):]
        elif kind == "insert":
            data = data[:at] + blob + data[at:]
        elif kind == "flip" and data:
            i = at % len(data)
            data = data[:i] + bytes([data[i] ^ blob[0]]) + data[i + 1:]
        elif kind == "dup_line":
            i = pos % len(lines)
            data = b"\n".join(lines[:i + 1] + lines[i:])
        elif kind == "drop_line":
            i = pos % len(lines)
            data = b"\n".join(lines[:i] + lines[i + 1:])
        elif kind == "swap_lines" and len(lines) > 2:
            i = 1 + pos % (len(lines) - 2)
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
            data = b"\n".join(lines)
    return data


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=MUTATIONS, seed=st.integers(0, 2**16), on_error=st.sampled_from(["raise", "skip"]))
@pytest.mark.parametrize("preset", sorted(SAMPLES))
def test_mutated_real_traces_raise_only_input_errors(tmp_path, preset, mutations, seed, on_error):
    """Byte- and line-level mutations of a real trace head: the loader returns a workload
    or raises InputError naming the file; nothing else escapes."""
    path = tmp_path / f"mutant{SAMPLES[preset][1]}"
    path.write_bytes(mutate(_sample(preset), mutations, random.Random(seed)))
    node = preset_node(preset, path, on_error=on_error, clip="truncate")
    try:
        workload = build_workload(node, seed=0, max_model_len=1 << 16)
    except InputError as err:
        assert str(path) in str(err)
        return
    except ConfigError as err:  # every row skipped or filtered: a clear "no requests" error
        assert "produced no requests" in str(err), err
        return
    assert len(workload.requests) >= 1
    if on_error == "raise":
        assert workload.summary["rows"]["skipped"]["total"] == 0


def test_untouched_trace_heads_load(tmp_path):
    for preset in sorted(SAMPLES):
        path = tmp_path / f"head{SAMPLES[preset][1]}"
        path.write_bytes(_sample(preset))
        workload = build_workload(preset_node(preset, path), seed=0, max_model_len=1 << 17)
        assert len(workload.requests) >= 1
