"""The hybrid KV manager (allocators/paged_hybrid.py) against hand arithmetic and theory:
exact block ids, the sliding-window bound, one state page per linear sequence, capacity
against ``paged``, the prefix-hit rule, and a breakdown every byte of which is counted
once (checked against an independent count from the block tables)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from omegaconf import OmegaConf

from pagebench.allocators.registry import PagedKVCacheManager
from pagebench.allocators.hybrid_layout import build_layout
from pagebench.allocators.paged_hybrid import HybridKVCacheManager
from harness.config.specs import SystemSpec
from harness.errors import ConfigError
from harness.models.hf_config import load_model_spec
from harness.models.model_layers import LayerGroup
from harness.run.run_setup import check_systems_for_model
from tests.engine_helpers import make_requests, paged, run

CONF = Path(__file__).parents[1] / "conf/model"


def hybrid(groups, block_size, num_pages, caching=True, max_context=1 << 20):
    """A manager over ``num_pages`` pages of these layer groups."""
    layout = build_layout(groups, block_size, 0, max_context)
    return HybridKVCacheManager(replace(layout, num_pages=num_pages), enable_prefix_caching=caching)


def sliding_full(window, layer_bytes=8, sliding_layers=1, full_layers=1):
    return (LayerGroup("sliding", sliding_layers, sliding_layers * layer_bytes, window=window),
            LayerGroup("full", full_layers, full_layers * layer_bytes))


def model(name):
    return load_model_spec(OmegaConf.load(CONF / f"{name}.yaml"))


# ------------------------------------------------------------------ layout arithmetic
def test_gemma3_groups_of_ten_layers_and_a_padded_short_group():
    # 62 layers, 5 local : 1 global -> 52 sliding + 10 full; group size min(52, 10) = 10
    layout = build_layout(model("gemma-3-27b").layer_groups, 16, 0, 131072)
    sliding, full = layout.kinds
    assert layout.group_size == 10 and sliding.group_layers == (10, 10, 10, 10, 10, 2)
    assert full.group_layers == (10,)
    # per layer and token: K and V of 16 heads x 128 in bf16 = 8 KiB; a page 10 layers x 16
    assert layout.page_bytes == 10 * 16 * 8192
    # unit: gcd(page, 10 and 2 layers' token bytes, 52 and 10 layers') = 2 layers' token
    assert layout.unit_bytes == 2 * 8192
    # one block of each of the 6 sliding groups: 8 padding layers x 16 tokens x 8 KiB
    assert layout.padding_units(sliding) * layout.unit_bytes == 8 * 16 * 8192


def test_qwen3_next_attention_block_is_raised_so_a_page_holds_the_state():
    # a Gated DeltaNet layer's state: 32 value heads x 128 x 128 + conv (4 - 1) x (2 x 16 x
    # 128 + 32 x 128) values, bf16; a full layer's token: K and V of 2 heads x 256, bf16
    state = (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) * 2
    token = 2 * 2 * 256 * 2
    layout = build_layout(model("qwen3-next-80b-a3b").layer_groups, 16, 0, 262144)
    assert state == 1_097_728 and math.ceil(state / token) == 536
    assert layout.attention_block_size == 544  # 536 rounded up to a multiple of 16
    assert layout.group_size == 12 and [k.num_groups for k in layout.kinds] == [3, 1]
    linear = layout.kinds[0]
    assert layout.padding_units(linear) * layout.unit_bytes == 3 * 12 * (544 * token - state)
    # the sim prices its decode kernel at the block its tables really have
    system = SystemSpec(name="paged_hybrid", kind="paged_hybrid", block_size=16, prefix_caching=True)
    assert HybridKVCacheManager.kernel_layout(system, model("qwen3-next-80b-a3b")) == ("paged", 544)
    assert HybridKVCacheManager.kernel_layout(system, model("gemma-3-27b")) == ("paged", 16)


def test_a_kind_with_fewer_bytes_a_token_keeps_the_floor_of_the_page():
    # full layers 8 bytes a token, sliding 6: a layer page is 4 x 8 = 32 bytes, which holds
    # floor(32 / 6) = 5 sliding tokens and leaves 2 bytes; unit gcd(32, 8, 6) = 2 bytes
    layout = build_layout((LayerGroup("sliding", 1, 6, window=8), LayerGroup("full", 1, 8)),
                          4, 0, 1024)
    sliding, full = layout.kinds
    assert (sliding.tokens_per_block, full.tokens_per_block) == (5, 4)
    assert layout.unit_bytes == 2 and layout.padding_units(sliding) * 2 == 2
    assert layout.padding_units(full) == 0


def test_uniform_model_unit_is_bytes_per_slot():
    for name in ("llama-3.1-8b", "mistral-7b", "deepseek-v3"):
        spec = model(name)
        layout = build_layout(spec.layer_groups, 16, 1000 * spec.bytes_per_slot, spec.max_context)
        assert layout.unit_bytes == spec.bytes_per_slot
        assert layout.num_pages == 1000 // 16  # the blocks paged gets from 1,000 slots


# -------------------------------------------------------------------- exact block ids
def test_sliding_blocks_leave_the_window_in_order():
    # window 4, 2 tokens a block, sliding then full group; pages 0..7 in the free queue
    m = hybrid(sliding_full(window=4), 2, num_pages=8)
    m.admit(0, [10, 11, 12], 9, 3)
    assert m.block_tables(0) == [[0, 1], [2, 3]]
    m.append(0, [13])  # 4 tokens: no new block
    m.append(0, [14])  # the query at 4 sees 1..4: nothing leaves; a 3rd block each
    assert m.block_tables(0) == [[0, 1, 4], [2, 3, 5]]
    m.append(0, [15])  # the query at 5 sees 2..5: block 0 (positions 0, 1) leaves
    assert m.block_tables(0) == [[1, 4], [2, 3, 5]]
    assert m.pool.free_queue() == [6, 7, 0]
    m.append(0, [16])  # the query at 6 sees 3..6: block 1 still needed; a 4th block each
    assert m.block_tables(0) == [[1, 4, 6], [2, 3, 5, 7]]
    m.append(0, [17])  # the query at 7 sees 4..7: block 1 leaves
    m.append(0, [18])  # 9 tokens: a 5th block each, from the freed ones
    assert m.block_tables(0) == [[4, 6, 0], [2, 3, 5, 7, 1]]
    assert m.layer_group_report()["kinds"][0]["window_freed_blocks"] == 2


# ------------------------------------------------------------ the sliding-window bound
@settings(max_examples=60, deadline=None)
@given(window=st.integers(1, 40), block=st.integers(1, 8), prompt=st.integers(1, 60),
       decodes=st.integers(0, 60), chunk=st.integers(1, 60))
def test_a_local_layer_holds_at_most_the_window_bound(window, block, prompt, decodes, chunk):
    m = hybrid(sliding_full(window), block, num_pages=10_000, caching=False)
    final = prompt + decodes
    m.admit(0, list(range(prompt)), final, min(chunk, prompt))
    n = min(chunk, prompt)
    while n < final:
        k = min(chunk, prompt - n) if n < prompt else 1
        m.append(0, list(range(k)))
        live = m.block_tables(0)[0]
        first = -(-(n + k) // block) - len(live)  # blocks before the live ones were freed
        assert first * block <= max(0, n - window + 1)  # every key a query of the step reads
        if k == 1:  # a decode step: the bound, and the exact one
            assert len(live) <= math.ceil((window - 1) / block) + 1 <= math.ceil(window / block) + 1
        else:  # a chunk of k queries reads W + k - 1 keys
            assert len(live) <= math.ceil((window + k - 2) / block) + 1
        n += k


# ---------------------------------------------------------------- linear state pages
def test_a_linear_group_holds_one_state_page_per_sequence():
    groups = (LayerGroup("linear", 2, 0, state_bytes=2 * 100), LayerGroup("full", 1, 8))
    m = hybrid(groups, 4, num_pages=64)
    # a 100-byte state in 8-byte tokens: 13 tokens -> 16 (a multiple of the block size 4)
    assert m.layout.attention_block_size == 16 and m.layout.group_size == 1
    for sid in range(3):
        m.admit(sid, [sid] * 5, 60, 5)
    for _ in range(40):
        for sid in range(3):
            m.append(sid, [7])
        states = [tables[:2] for tables in map(m.block_tables, range(3))]
        assert all(len(t) == 1 for tables in states for t in tables)  # one page each group
        assert m.breakdown(False).group_blocks[0] == 3 * 2
    copies = m.fork(0, 9, 60)
    assert len(copies) == 2 and m.breakdown(False).group_blocks[0] == 4 * 2
    assert [src for src, _ in copies] == [t[0] for t in m.block_tables(0)[:2]]


# ------------------------------------------------------------ capacity against paged
def test_a_sliding_model_fits_more_requests_than_paged_by_hand_arithmetic():
    # window 8, block 4, final length 40: paged holds ceil(40 / 4) = 10 blocks a request,
    # a decoding sliding layer at most ceil((8 - 1) / 4) + 1 = 3; 30 blocks in both pools
    def decode_all(manager, count):
        for sid in range(count):
            if manager.admit(sid, [sid] * 4, 40, 4) is None:
                return False
        for _ in range(36):
            for sid in range(count):
                if manager.append(sid, [1]) is None:
                    return False
        return True

    sliding = (LayerGroup("sliding", 1, 8, window=8),)
    for count, fits in ((10, True), (11, False)):
        assert decode_all(hybrid(sliding, 4, num_pages=30, caching=False), count) is fits
    for count, fits in ((3, True), (4, False)):
        assert decode_all(PagedKVCacheManager(30, 4, enable_prefix_caching=False), count) is fits


def test_a_uniform_model_gives_exactly_the_paged_figures():
    requests = make_requests([(int(p), int(o)) for p, o in
                              np.random.default_rng(4).integers(1, 300, size=(40, 2))],
                             gap=0.004, prefix=np.arange(48, dtype=np.int32))
    system = SystemSpec(name="paged_hybrid", kind="paged_hybrid", prefix_caching=True, block_size=16)
    a, b = run(requests, paged(16, True)), run(requests, system)
    steps_a, steps_b = a.recorder.step_table(), b.recorder.step_table()
    assert steps_a.drop(columns=["layer_group0_blocks"], errors="ignore").equals(
        steps_b.drop(columns=["layer_group0_blocks"]))
    assert a.scheduler.prompt_tokens_cached == b.scheduler.prompt_tokens_cached > 0
    assert a.recorder.request_table().equals(b.recorder.request_table())


# ---------------------------------------------------------------- the prefix-hit rule
def _prefix_case(other_prompt_len):
    """Window 5, block 2, 14 pages. A (prompt P of 10 tokens) decodes one token (the
    sliding group frees blocks 0-2) and ends; then a request of ``other_prompt_len``
    tokens evicts free pages from the queue's head."""
    m = hybrid(sliding_full(window=5), 2, num_pages=14)
    prompt = list(range(100, 110))
    m.admit(0, prompt, 11, 10)  # sliding 0-4, full 5-9
    m.append(0, [1])  # frees sliding 2, 1, 0 (newest first); pops 10 and 11
    m.free(0)  # queue: 12 13 2 1 0 | 10 4 3 | 11 9 8 7 6 5
    m.admit(1, list(range(200, 200 + other_prompt_len)), other_prompt_len, other_prompt_len)
    return m, prompt + [300, 301]


def test_a_sliding_group_hits_with_only_the_window_blocks_cached():
    m, prompt = _prefix_case(3)  # pops 12, 13, 2, 1: P's sliding blocks 1 and 2 are gone
    # full: blocks 0-4 cached -> 10 tokens; sliding: the ceil(4 / 2) = 2 blocks before
    # position 10 (blocks 3 and 4) are cached -> 10 tokens
    assert m.cached_prefix_tokens(prompt) == 10
    assert m.admit(2, prompt, 12, 12).num_cached_tokens == 10
    assert m.block_tables(2) == [[3, 4, 0], [5, 6, 7, 8, 9, 10]]


def test_a_sliding_group_without_its_window_blocks_ends_the_hit():
    m, prompt = _prefix_case(10)  # pops 10 pages: sliding 3, 4 and full block 4 (page 9) go
    # full alone would serve blocks 0-3 (8 tokens); sliding has none of its window there
    assert m.cached_prefix_tokens(prompt) == 0


def test_a_model_with_a_linear_group_serves_no_prefix():
    groups = (LayerGroup("linear", 1, 0, state_bytes=16), LayerGroup("full", 1, 8))
    m = hybrid(groups, 2, num_pages=32)
    m.admit(0, list(range(8)), 8, 8)
    m.free(0)
    assert not m.capabilities.prefix_cache and m.cached_prefix_tokens(list(range(10))) == 0


# ------------------------------------------------------------------------- bad input
def test_unsupported_models_are_refused_naming_the_key():
    only_linear = replace(model("qwen3-next-80b-a3b"), layer_pattern=("linear",))
    system = SystemSpec(name="paged_hybrid", kind="paged_hybrid", prefix_caching=True, block_size=16)
    with pytest.raises(ConfigError, match=r"^allocator\.paged_hybrid\.kind: .*only linear"):
        check_systems_for_model([system], only_linear)
    short = replace(model("qwen3-next-80b-a3b"), max_context=512)  # the state needs 544 tokens
    with pytest.raises(ConfigError, match=r"^allocator\.paged_hybrid\.block_size: .*544"):
        check_systems_for_model([system], short)


# ------------------------------------------ every byte in one category, at every step
def reference_breakdown(m, seqs):
    """Token states and page padding in bytes, from the block tables and token counts."""
    layout, token_bytes, padding, used = m.layout, 0, 0, set()
    for sid, n in seqs.items():
        tables = m.block_tables(sid)
        g = 0
        for kind in layout.kinds:
            t = kind.tokens_per_block
            for layers in kind.group_layers:
                table = tables[g]
                first = -(-n // t) - len(table) if t else 0
                for j, block in enumerate(table):
                    if (g, block) in used:
                        continue
                    used.add((g, block))
                    if t is None:
                        token_bytes += layers * kind.layer_bytes
                        padding += layout.page_bytes - layers * kind.layer_bytes
                    else:
                        token_bytes += min(t, n - (first + j) * t) * layers * kind.layer_bytes
                        padding += layout.page_bytes - t * layers * kind.layer_bytes
                g += 1
    assert len({b for _, b in used}) == len(used) == m.num_blocks - m.pool.num_free
    return token_bytes, padding


MODELS = {
    "sliding+full": sliding_full(window=6, sliding_layers=3, full_layers=2),  # groups 2+1, 2
    "linear+full": (LayerGroup("linear", 2, 0, state_bytes=2 * 40), LayerGroup("full", 1, 8)),
    "sliding": (LayerGroup("sliding", 2, 16, window=5),),
    "window1+full": sliding_full(window=1),  # a query sees only its own token
    # 5 bytes a sliding token, 8 a full one: 3 and 2 tokens a 16-byte page (prefix hits
    # must end on both kinds' blocks)
    "floor": (LayerGroup("sliding", 1, 5, window=7), LayerGroup("full", 1, 8)),
}


class HybridMachine(RuleBasedStateMachine):
    groups = MODELS["sliding+full"]

    def __init__(self):
        super().__init__()
        self.m = hybrid(self.groups, 2, num_pages=40)
        self.twin = hybrid(self.groups, 2, num_pages=40)  # told longer final lengths
        self.seqs: dict[int, dict] = {}
        self.next_id = 0

    def both(self, op, *args, final_at=None):
        """``op`` on the manager and on its twin (argument ``final_at``, the final length, 3
        longer): final_len is an accounting input, so every allocation must agree."""
        result = getattr(self.m, op)(*args)
        twin_args = [a + 3 if i == final_at else a for i, a in enumerate(args)]
        assert getattr(self.twin, op)(*twin_args) == result, f"{op} depends on final_len"
        return result

    @rule(data=st.data())
    def admit(self, data):
        prompt = data.draw(st.sampled_from([[], [1] * 6, [1, 2, 3, 4]])) + data.draw(
            st.lists(st.integers(0, 2), max_size=6))
        prompt = prompt or [0]
        final = len(prompt) + data.draw(st.integers(0, 12))
        num = data.draw(st.integers(1, len(prompt)))
        can = self.both("can_admit", prompt, final, num, final_at=1)
        got = self.both("admit", self.next_id, prompt, final, num, final_at=2)
        assert (got is not None) == can
        if got is not None:
            self.seqs[self.next_id] = {"n": max(num, got.num_cached_tokens), "final": final,
                                       "prompt": prompt}
        self.next_id += 1

    @precondition(lambda self: any(s["n"] < s["final"] for s in self.seqs.values()))
    @rule(data=st.data())
    def append(self, data):
        sid = data.draw(st.sampled_from(sorted(i for i, s in self.seqs.items() if s["n"] < s["final"])))
        s = self.seqs[sid]
        k = data.draw(st.integers(1, min(4, s["final"] - s["n"])))
        tokens = (s["prompt"][s["n"]:] + [0] * k)[:k]
        if self.both("append", sid, tokens) is not None:
            s["n"] += k

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.seqs)))
        p = self.seqs[parent]
        if self.both("fork", parent, self.next_id, p["final"], final_at=2) is not None:
            self.seqs[self.next_id] = dict(p)
        self.next_id += 1

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        self.both("free", sid)
        del self.seqs[sid]

    @invariant()
    def every_byte_is_in_one_category(self):
        unit = self.m.slot_bytes
        token_bytes, padding = reference_breakdown(self.m, {i: s["n"] for i, s in self.seqs.items()})
        for blocked in (False, True):
            b = self.m.breakdown(blocked)
            parts = (b.token_states, b.reserved, b.internal_over_reservation, b.internal_rounding,
                     b.internal_page_padding, b.external_fragmentation, b.idle)
            assert min(parts) >= 0 and sum(parts) == b.capacity_slots == self.m.capacity_slots
            assert b.capacity_slots * unit == 40 * self.m.layout.page_bytes
            assert (b.token_states * unit, b.internal_page_padding * unit) == (token_bytes, padding)
            assert b.allocated_slots == b.token_states + b.reserved + b.internal_fragmentation


for _name, _groups in MODELS.items():
    _case = type(f"Hybrid_{_name}", (HybridMachine,), {"groups": _groups}).TestCase
    _case.settings = settings(max_examples=15, stateful_step_count=30, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    globals()[f"TestHybrid_{_name.replace('+', '_')}"] = _case
del _name, _groups, _case


def test_a_torch_run_is_refused_before_any_system_runs():
    from harness.config.specs import EngineSpec
    from harness.run.run_setup import check_systems_for_engine

    system = SystemSpec(name="paged_hybrid", kind="paged_hybrid", prefix_caching=True, block_size=16)
    with pytest.raises(ConfigError, match="paged_hybrid"):
        check_systems_for_engine([system], EngineSpec(executor="torch"))


def test_results_weight_each_kinds_blocks_by_step_duration():
    import pandas as pd

    from harness.metrics.summaries import layer_group_summary

    steps = pd.DataFrame({"duration_s": [1.0, 3.0], "layer_group0_blocks": [2, 6],
                          "layer_group1_blocks": [4, 4]})
    report = {"group_size": 1, "kinds": [{"kind": "sliding"}, {"kind": "full"}]}
    kinds = layer_group_summary(report, steps)["kinds"]
    assert [k["mean_blocks"] for k in kinds] == [(2 * 1 + 6 * 3) / 4, 4.0]


def test_a_block_is_cached_in_every_group_of_its_kind_or_in_none():
    # two full groups (ids 0, 1) and a sliding one, one token a block, 24 pages
    groups = (LayerGroup("full", 2, 16), LayerGroup("sliding", 1, 8, window=1000))
    m = hybrid(groups, 1, num_pages=24)
    m.admit(0, list(range(1, 9)), 8, 8)  # C: full 0-7 and 8-15, sliding 16-23
    m.free(0)  # queue: 7..0 | 15..8 | 23..16
    m.admit(1, [90, 91, 92, 93], 4, 4)  # pops 7..0 and 15..12: group 0 loses all of C
    m.admit(2, [1], 1, 1)  # pops 11, 10, 9: group 1 still holds C's block 0 (page 8)
    # group 0's key of block 0 is free, group 1's is page 8's: the new block is cached in
    # neither, so no prompt can take page 11 in one group and page 8 in the other
    assert m.cached_prefix_tokens([1, 60]) == 0
    m.admit(3, [1, 60], 2, 2)
    token_bytes, padding = reference_breakdown(m, {1: 4, 2: 1, 3: 2})
    b = m.breakdown(False)
    assert (b.token_states * m.slot_bytes, b.internal_page_padding * m.slot_bytes) == (token_bytes, padding)


def test_an_engine_run_on_a_sliding_hybrid_accounts_every_step():
    from harness.config.specs import ModelSpec
    from harness.engine.engine import run_engine
    from harness.engine.executors import make_executor
    from harness.engine.scheduler import Scheduler
    from harness.config.systems import build_manager
    from tests.engine_helpers import HARDWARE, engine_spec

    local = ModelSpec(name="local", num_layers=6, hidden_size=64, num_heads=4, num_kv_heads=2,
                      head_dim=16, intermediate_size=128, vocab_size=1000, max_context=4096,
                      architecture="gemma3", sliding_window=64,
                      layer_pattern=("sliding", "sliding", "full"))
    system = SystemSpec(name="paged_hybrid", kind="paged_hybrid", prefix_caching=True, block_size=16)
    spec = engine_spec(kv_capacity_slots=1024)
    requests = make_requests([(int(p), int(o)) for p, o in
                              np.random.default_rng(5).integers(1, 400, size=(30, 2))],
                             gap=0.002, prefix=np.arange(40, dtype=np.int32))
    manager = build_manager(system, 1024, local, spec, 4096)
    executor = make_executor(spec, system, local, HARDWARE, manager)
    result = run_engine(requests, Scheduler(manager, spec), executor, spec, max_model_len=4096)
    steps = result.recorder.step_table()
    categories = ["token_states", "reserved", "internal_over_reservation", "internal_rounding",
                  "internal_page_padding", "external_fragmentation", "idle"]
    assert (steps[categories].sum(axis=1) == manager.capacity_slots).all()
    blocks = steps["layer_group0_blocks"] + steps["layer_group1_blocks"]  # sliding, full
    assert (steps["allocated_slots"] == blocks * manager.layout.page_units).all()
    # 4 sliding layers in 2 KV cache groups, 2 full in one: a window keeps no more than all
    assert (steps["layer_group0_blocks"] <= 2 * steps["layer_group1_blocks"]).all()
    assert (result.recorder.request_table()["status"] == "finished").all()
    assert result.scheduler.num_preemptions > 0 and result.scheduler.prompt_tokens_cached > 0


def test_the_report_compares_the_kv_a_running_sequence_holds():
    from pagebench.reports.layer_groups import layer_group_parts

    def system(capacity, slot_bytes, usage_pct, batch, padding_slots, groups=None):
        memory = {"capacity_slots": capacity, "block_level_usage_pct": usage_pct,
                  "internal_page_padding_pct": 100.0 * padding_slots / capacity,
                  "mean_slots": {"token_states": 0.0, "internal_page_padding": padding_slots}}
        return {"memory": memory, "slot_bytes": slot_bytes, "batch": {"mean_seqs": batch},
                **({"layer_groups": groups} if groups else {})}

    groups = {"group_size": 10, "page_bytes": 2**20, "num_pages": 64, "attention_block_size": 16,
              "kinds": [{"kind": "sliding", "kv_cache_groups": 6, "layers": 52, "padding_layers": 8,
                         "tokens_per_block": 16, "window": 1024, "peak_blocks": 9, "mean_blocks": 4.5,
                         "window_freed_blocks": 3, "prefix_hit_blocks": 2}]}
    # both pools 64 GiB; paged: half of it over 2 sequences (16 GiB each); the hybrid: a
    # quarter over 4 (4 GiB each, 4x less), 1 GiB of it padding (1/64 of the pool)
    systems = {"paged": system(2**16, 2**20, 50.0, 2.0, 0.0),
               "paged_hybrid": system(2**22, 2**14, 25.0, 4.0, 2**16, groups)}
    text = "".join(layer_group_parts(systems))
    assert "holds 4.00 GiB of KV on average against paged's 16.00 GiB (4.00x less)" in text
    assert "page padding takes 1.56% of its pool" in text
    assert "52 + 8" in text and layer_group_parts({"paged": systems["paged"]}) == []
