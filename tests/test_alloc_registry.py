"""Every registered manager, through the protocol only (allocators/base.py).

The systems come from the catalog (conf/allocator/standard.yaml) and the managers from
the registry (``allocators.MANAGERS``): a manager in a new file with a catalog entry is
tested here without editing this file. A hypothesis state machine drives random admit /
append / decode / fork / free / swap and checks, after every step, what holds for any
manager: no slot is owned by two sequences unless both hold the same token at the same
position (prefix sharing, fork), the breakdown sums to capacity, token states are the
distinct slots written, logical tokens the tokens written. A manager whose policy does not
declare ``knows_final_len`` is run twice in lockstep, once with each sequence's true final
length and once with a longer one: every allocation must be the same (oracle knowledge
reaches only the breakdown).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagebench.allocators.registry import MANAGERS
from harness.config.specs import ModelSpec, select_systems

CATALOG = yaml.safe_load((Path(__file__).parents[1] / "conf/allocator/standard.yaml").read_text())
BLOCK_SIZE = 4
SYSTEMS = select_systems(list(CATALOG), CATALOG, BLOCK_SIZE)
# 1 layer, 8 KV heads of 1024 fp16 values: 16 KiB per token per layer's K, so a 64 KiB page
# holds 4 tokens (page-granular managers get pools of a few pages, like the paged ones).
MODEL = ModelSpec(name="wide", num_layers=1, hidden_size=8192, num_heads=8, num_kv_heads=8,
                  head_dim=1024, intermediate_size=64, vocab_size=16, max_context=64)
CAPACITY, CPU_SLOTS, MAX_LEN = 48, 24, 40
PREFIXES = [[], [1] * 8, [1, 2, 0, 1, 2, 0, 1, 2]]
SLACK = 5  # the second manager's final lengths are this much longer


def build(system):
    return MANAGERS[system.kind].from_system(system, CAPACITY, CPU_SLOTS, MAX_LEN, MODEL)


def test_every_registered_manager_has_a_catalog_entry():
    assert {system.kind for system in SYSTEMS} == set(MANAGERS)


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda s: s.name)
def test_each_catalog_system_declares_its_capabilities(system):
    caps = build(system).capabilities
    assert caps.layout in ("paged", "contiguous", "none")
    assert caps.bulk_decode in (None, "paged", "contiguous", "hybrid")
    assert caps.bulk_decode in (None, "hybrid") or caps.batched_decode  # (hybrid: append)


class ProtocolMachine(RuleBasedStateMachine):
    system = SYSTEMS[0]

    def __init__(self):
        super().__init__()
        self.a = build(self.system)
        self.twin = None if self.a.capabilities.knows_final_len else build(self.system)
        self.seqs: dict[int, dict] = {}  # seq id -> tokens, final, swapped
        self.next_id = 0

    # ------------------------------------------------------------ helpers
    def both(self, op, *args, twin_args=None):
        """``op`` on the manager and, in lockstep, on its twin; their allocations agree."""
        result = getattr(self.a, op)(*args)
        if self.twin is not None:
            other = getattr(self.twin, op)(*(twin_args or args))
            assert result == other, f"{op}: the allocation depends on final_len"
        return result

    def resident(self):
        return sorted(i for i, s in self.seqs.items() if not s["swapped"])

    def open_ids(self):
        return [i for i in self.resident() if len(self.seqs[i]["tokens"]) < self.seqs[i]["final"]]

    # -------------------------------------------------------------- rules
    @rule(data=st.data())
    def admit(self, data):
        prompt = data.draw(st.sampled_from(PREFIXES)) + data.draw(st.lists(st.integers(0, 2), max_size=8))
        prompt = prompt[:20] or [0]
        final = len(prompt) + data.draw(st.integers(0, MAX_LEN - SLACK - len(prompt)))
        num = data.draw(st.integers(1, len(prompt)))
        sid = self.next_id
        self.next_id += 1
        can = self.both("can_admit", prompt, final, num, twin_args=(prompt, final + SLACK, num))
        got = self.both("admit", sid, prompt, final, num, twin_args=(sid, prompt, final + SLACK, num))
        assert (got is not None) == can
        if got is not None:
            self.seqs[sid] = {"tokens": list(prompt[:max(num, got.num_cached_tokens)]),
                              "prompt": prompt, "final": final, "swapped": False}

    @precondition(lambda self: self.open_ids())
    @rule(data=st.data())
    def append(self, data):
        sid = data.draw(st.sampled_from(self.open_ids()))
        s = self.seqs[sid]
        k = data.draw(st.integers(1, min(6, s["final"] - len(s["tokens"]))))
        tokens = self.next_tokens(s, k, data)
        if self.both("append", sid, tokens) is not None:
            s["tokens"] += tokens

    @precondition(lambda self: self.open_ids())
    @rule(data=st.data())
    def append_decode(self, data):
        if not self.a.capabilities.batched_decode:
            return
        sids = data.draw(st.lists(st.sampled_from(self.open_ids()), min_size=1, unique=True))
        tokens = [self.next_tokens(self.seqs[sid], 1, data)[0] for sid in sids]
        copies: list = []
        done = self.a.append_decode(sids, tokens, copies)
        if self.twin is not None:
            twin_copies: list = []
            assert self.twin.append_decode(sids, tokens, twin_copies) == done
            assert twin_copies == copies
        for sid, token in zip(sids[:done], tokens):
            self.seqs[sid]["tokens"].append(token)

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.resident()))
        p = self.seqs[parent]
        n = len(p["tokens"])
        base = max(n, len(p["prompt"]))
        final = base + data.draw(st.integers(0, max(0, MAX_LEN - SLACK - base)))
        child = self.next_id
        self.next_id += 1
        if self.both("fork", parent, child, final, twin_args=(parent, child, final + SLACK)) is not None:
            self.seqs[child] = {**p, "tokens": list(p["tokens"]), "final": final}

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        self.both("free", sid)
        del self.seqs[sid]

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def swap_out(self, data):
        sid = data.draw(st.sampled_from(self.resident()))
        if self.both("swap_out", sid) is not None:
            self.seqs[sid]["swapped"] = True

    @precondition(lambda self: len(self.resident()) < len(self.seqs))
    @rule(data=st.data())
    def swap_in(self, data):
        sid = data.draw(st.sampled_from([i for i in self.seqs if self.seqs[i]["swapped"]]))
        if self.both("swap_in", sid) is not None:
            self.seqs[sid]["swapped"] = False

    def next_tokens(self, s, k, data):
        """The prompt's tokens first (a chunked prefill), then drawn ones (decodes)."""
        n = len(s["tokens"])
        given = s["prompt"][n:n + k]
        return given + data.draw(st.lists(st.integers(0, 2), min_size=k - len(given),
                                          max_size=k - len(given)))

    # --------------------------------------------------------- invariants
    @invariant()
    def no_slot_holds_two_different_tokens(self):
        owner: dict[int, tuple[int, int]] = {}
        for sid in self.resident():
            tokens = self.seqs[sid]["tokens"]
            slots = self.a.slot_mapping(sid, 0, len(tokens))
            for pos, (slot, token) in enumerate(zip(slots, tokens)):
                assert 0 <= slot < self.a.capacity_slots
                assert owner.setdefault(slot, (pos, token)) == (pos, token), (
                    f"slot {slot} owned twice: seq {sid} pos {pos}")
        self.written_slots = len(owner)

    @invariant()
    def breakdown_sums_to_capacity_and_counts_the_written_slots(self):
        self.no_slot_holds_two_different_tokens()
        for blocked in (False, True):
            b = self.a.breakdown(blocked)
            parts = (b.token_states, b.reserved, b.internal_over_reservation, b.internal_rounding,
                     b.internal_page_padding, b.external_fragmentation, b.idle)
            assert min(parts) >= 0 and sum(parts) == b.capacity_slots == self.a.capacity_slots
            assert b.token_states == self.written_slots
            assert b.logical_tokens == sum(len(self.seqs[i]["tokens"]) for i in self.resident())
            assert 0 <= b.cached_free_slots <= b.free_slots


SETTINGS = settings(max_examples=10, stateful_step_count=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
for _system in SYSTEMS:
    _case = type(f"Protocol_{_system.name}", (ProtocolMachine,), {"system": _system}).TestCase
    _case.settings = SETTINGS
    globals()[f"TestProtocol_{_system.name}"] = _case
del _system, _case
