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

from alloc_model import ContiguousModel, PagedModel, check_breakdown
from harness.errors import ConfigError, InputError
from harness.workloads import build_workload

OPS_PER_EXAMPLE = 1000
FULL_EVERY = 50
PAGED_EXAMPLES = 30  # x 2 (prefix caching on / off) x 1,000 ops = 60,000 ops
CONTIGUOUS_EXAMPLES = 45  # x 1,000 ops = 45,000 ops
OPS = ("admit", "append", "append", "append", "fork", "free", "swap_out", "swap_in")


class _Driver:
    """Random operations on a reference model (tests/alloc_model.py), drawn from a seeded rng."""

    MAX_APPEND = 16  # tokens at most in one append

    def __init__(self, seed: int, model: PagedModel | ContiguousModel) -> None:
        self.rng = random.Random(seed)
        self.model = model
        self.ops = 0

    def run(self, num_ops: int) -> None:
        model = self.model
        for i in range(num_ops):
            op = self.rng.choice(OPS)
            if op != "admit" and not (model.swapped() if op == "swap_in" else
                                      model.seqs if op == "free" else model.resident()):
                op = "admit"
            getattr(self, op)()
            self.ops += 1
            check_breakdown(model.m)
            if i % FULL_EVERY == FULL_EVERY - 1:
                model.check()
        model.check()

    def random_tokens(self, k: int) -> list[int]:
        return [self.rng.randrange(4) for _ in range(k)]

    def append(self) -> None:
        sid = self.rng.choice(self.model.resident())
        room = self.model.room(sid)
        if room == 0:
            self.model.refuse_append_when_full(sid)
            return
        k = self.rng.randint(1, min(room, self.MAX_APPEND))
        self.model.append(sid, self.model.next_tokens(sid, k, self.random_tokens))

    def free(self) -> None:
        self.model.free(self.rng.choice(list(self.model.seqs)))

    def swap_out(self) -> None:
        self.model.swap_out(self.rng.choice(self.model.resident()))

    def swap_in(self) -> None:
        self.model.swap_in(self.rng.choice(self.model.swapped()))


class PagedDriver(_Driver):
    def __init__(self, seed: int, num_blocks: int, block_size: int, caching: bool,
                 num_cpu: int) -> None:
        super().__init__(seed, PagedModel(num_blocks, block_size, num_cpu, caching))
        self.bs = block_size
        self.MAX_APPEND = 2 * block_size
        # a few stems so that prompts share long prefixes and the cache hits
        self.stems = [[self.rng.randrange(4) for _ in range(6 * block_size)] for _ in range(3)]

    def admit(self) -> None:
        rng, bs = self.rng, self.bs
        stem = rng.choice(self.stems)[:rng.randrange(0, 6 * bs)]
        prompt = stem + [rng.randrange(4) for _ in range(rng.randrange(1, 3 * bs))]
        final = len(prompt) + rng.randrange(0, 4 * bs)
        self.model.admit(prompt, final, rng.randint(1, len(prompt)))

    def fork(self) -> None:
        parent = self.rng.choice(self.model.resident())
        n = len(self.model.seqs[parent]["tokens"])
        self.model.fork(parent, n + self.rng.randrange(0, 3 * self.bs))


class ContiguousDriver(_Driver):
    def __init__(self, seed: int, capacity: int, policy: str, arena: str, num_cpu: int,
                 max_len: int) -> None:
        super().__init__(seed, ContiguousModel(capacity, policy, arena, num_cpu, max_len))
        self.max_len = max_len

    def admit(self) -> None:
        rng = self.rng
        plen = rng.randint(1, self.max_len // 2)
        prompt = [rng.randrange(4) for _ in range(plen)]
        final = plen + rng.randrange(0, self.max_len - plen + 1)
        self.model.admit(prompt, final, rng.randint(1, plen))

    def fork(self) -> None:
        parent = self.rng.choice(self.model.resident())
        p = self.model.seqs[parent]
        n = len(p["tokens"])
        final = max(len(p["prompt"]), n + self.rng.randrange(0, max(1, self.max_len - n + 1)))
        self.model.fork(parent, final)


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
