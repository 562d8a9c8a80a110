"""vAttention-style manager: exact pages, tokens per page and breakdown on tiny pools,
the page-mapping charge, and its bad input."""

from __future__ import annotations

import dataclasses

import pytest

from pagebench.allocators.vattention import VAttentionKVCacheManager, tokens_per_page
from engine_helpers import MODEL, engine_spec, make_requests, paged, run
from harness.config.specs import ModelSpec, SystemSpec, select_systems
from harness.errors import ConfigError
from harness.run.run_setup import check_systems_for_model

MIB = 1 << 20
# Llama-3.1-8B: 32 layers, 8 KV heads of 128, bf16 -> 2 KiB per token per layer's K
LLAMA_31_8B = ModelSpec(name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32,
                        num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
                        max_context=131072, dtype="bfloat16")
CATALOG = {"vattention": {"kind": "vattention", "page_size": 65536, "keep_mapped": False,
                          "async_mapping": False, "map_page_s": 37.44e-6, "unmap_page_s": 25.63e-6}}


def vattention(**changes) -> SystemSpec:
    node = {name: dict(entry, **changes) for name, entry in CATALOG.items()}
    return select_systems(["vattention"], node, 16)[0]


def test_a_2_mib_page_of_llama_31_8b_holds_1024_tokens_and_a_17_token_request_commits_one_page_per_buffer():
    assert tokens_per_page(2 * MIB, LLAMA_31_8B) == 1024
    pool_slots = 4 * 1024
    m = VAttentionKVCacheManager(pool_slots, 2 * MIB, 2048, layers=32, max_model_len=8192)
    assert m.num_groups == 4 and m.capacity_slots == 4096
    assert m.admit(0, list(range(17)), final_len=20, num_tokens=17) is not None
    b = m.breakdown(False)
    # 1,024 token slots committed per layer and K/V: 17 written, 3 still to fill, 1,004 never
    assert (b.allocated_slots, b.token_states, b.reserved, b.internal_rounding) == (1024, 17, 3, 1004)
    assert b.idle == 3 * 1024 and b.internal_over_reservation == 0
    assert m.stats.mapped_pages == 2 * 32  # one page per layer, for K and for V
    assert m.slot_mapping(0, 0, 17) == list(range(17))
    assert m.virtual_slots == 8192  # reported, not counted as KV memory
    assert sum(b[1:7]) == b.capacity_slots


def test_page_groups_are_taken_lowest_first_and_return_unmapped_unless_kept_mapped():
    for keep in (False, True):
        m = VAttentionKVCacheManager(16, 64, 16, layers=2, max_model_len=32, keep_mapped=keep)
        assert (m.tokens_per_page, m.num_groups) == (4, 4)
        m.admit(0, [1] * 5, final_len=9, num_tokens=5)  # 2 groups
        m.admit(1, [2] * 3, final_len=3, num_tokens=3)  # 1 group
        assert (m.page_groups(0), m.page_groups(1)) == ([0, 1], [2])
        assert m.append(0, [3, 3, 3, 3]) == []  # 9 tokens: a third group
        assert m.page_groups(0) == [0, 1, 3]
        assert m.admit(2, [4], final_len=2, num_tokens=1) is None  # the pool is full
        m.free(0)
        assert m.stats.mapped_pages == 4 * 4  # 4 groups of 2 layers x K/V
        assert m.stats.unmapped_pages == (0 if keep else 3 * 4)
        m.admit(3, [5] * 6, final_len=8, num_tokens=6)
        assert m.page_groups(3) == [0, 1]  # the freed pages, in the order the request held them
        assert m.stats.mapped_pages == 4 * 4 + (0 if keep else 2 * 4)


def test_fork_copies_every_written_slot_into_the_childs_own_pages():
    m = VAttentionKVCacheManager(16, 64, 16, layers=1, max_model_len=32)
    m.admit(0, [1] * 6, final_len=8, num_tokens=6)
    copies = m.fork(0, 1, final_len=7)
    assert copies == [(src, dst) for src, dst in zip(range(6), [8, 9, 10, 11, 12, 13])]
    b = m.breakdown(False)
    assert (b.token_states, b.logical_tokens, b.allocated_slots) == (12, 12, 16)
    assert (b.reserved, b.internal_rounding) == (2 + 1, 0 + 1)


def test_synchronous_page_mapping_costs_exactly_the_cited_time_per_page_and_async_costs_none():
    requests = make_requests([(40, 10), (600, 30), (100, 300)], gap=0.01)
    spec = engine_spec(kv_capacity_slots=2048)
    sync = run(requests, vattention(), spec)
    overlapped = run(requests, vattention(async_mapping=True), spec)
    manager = sync.scheduler.manager
    assert manager.tokens_per_page == 512  # 64 KiB / (4 heads x 16 x 2 bytes)
    pages = 2 * MODEL.layers  # per group: one page per layer, K and V
    assert manager.stats.mapped_pages == manager.stats.unmapped_pages == (1 + 2 + 1) * pages
    # NOTE: the last request's pages are unmapped after the last step: no step pays for them
    charge = 4 * pages * 37.44e-6 + 3 * pages * 25.63e-6
    steps_sync, steps_async = sync.recorder.steps["duration_s"], overlapped.recorder.steps["duration_s"]
    assert len(steps_sync) == len(steps_async)
    assert sum(steps_sync) - sum(steps_async) == pytest.approx(charge, rel=1e-9)
    assert sync.output_digest == run(requests, paged(16), spec).output_digest


@pytest.mark.parametrize("page_size", [100000, 4096, True, "64k"])
def test_an_unsupported_page_size_is_a_one_line_error_naming_the_key(page_size):
    with pytest.raises(ConfigError, match=r"^allocator\.vattention\.page_size: must be one of "
                                          r"65536, 131072, 262144, 2097152 bytes"):
        vattention(page_size=page_size)


def test_a_page_smaller_than_one_token_of_one_layer_is_an_error_naming_the_key():
    wide = dataclasses.replace(LLAMA_31_8B, name="wide", num_kv_heads=64, head_dim=1024)
    with pytest.raises(ConfigError, match=r"^allocator\.vattention\.page_size: 65536 bytes is "
                                          r"smaller than one token of one layer of wide \(131072"):
        check_systems_for_model([vattention()], wide)
    check_systems_for_model([vattention(page_size=2 * MIB)], wide)  # 16 tokens: fine


def test_a_missing_vattention_key_is_an_error_naming_it():
    node = {"vattention": {k: v for k, v in CATALOG["vattention"].items() if k != "map_page_s"}}
    with pytest.raises(ConfigError, match=r"^allocator\.vattention\.map_page_s: missing value"):
        select_systems(["vattention"], node, 16)


def test_the_page_size_sweep_composes_vattention_at_every_page_size_against_paged_16_and_128():
    from test_sweep import compose

    cfg = compose("experiment=page_size_sweep", "experiment.page_size=2097152", hydra_cfg=True)
    params = dict(cfg.hydra.sweeper.params)
    assert params["experiment.page_size"] == "65536,131072,262144,2097152"
    assert set(params["workload"].split(",")) == {"docqa", "sharegpt_like"}
    assert set(params["model"].split(",")) == {"llama-3.1-8b", "llama-2-13b"}
    systems = {s.name: s for s in select_systems(cfg.systems, cfg.allocator, cfg.block_size)}
    assert systems["vattention"].option("page_size") == 2 * MIB
    assert (systems["paged_16"].block_size, systems["paged_128"].block_size) == (16, 128)
