"""The offload tiers (engine.offload): evicted prefix-cache keys move GPU -> CPU -> disk in
LRU order, a later prompt's hit run continues there (its own hit kind, its blocks allocated),
the load is priced bytes / bandwidth in the step that admits it, and bad sizes are refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagebench.allocators.offload_tier import OffloadTiers
from pagebench.allocators.paged import PagedKVCacheManager
from engine_helpers import HARDWARE, MODEL, engine_spec, make_requests, paged, run
from harness.config.specs import GIB, CostSpec
from harness.engine.plan import ScheduledChunk, StepPlan
from harness.engine.sequence import Sequence, SequenceGroup
from harness.engine.sim_executor import OffloadLoadCost
from harness.config.offload import OffloadSpec
from harness.metrics.offload import offload_figures, offload_summary
from harness.workloads.request import Request

BS = 4


def _manager(cpu_blocks: int, disk_blocks: int, num_blocks: int = 4) -> PagedKVCacheManager:
    m = PagedKVCacheManager(num_blocks, BS)
    m.attach_offload(OffloadTiers(cpu_blocks, disk_blocks))
    return m


# ------------------------------------------------------------------ exact keys on a small pool
def test_evicted_keys_move_gpu_to_cpu_to_disk_and_a_later_prompt_loads_them():
    m = _manager(cpu_blocks=2, disk_blocks=1)
    tiers = m.offload
    p = list(range(13))  # 3 full blocks (k0 k1 k2) + 1 token
    m.admit(0, p, 13, 13)
    assert m.block_table(0) == [0, 1, 2, 3]
    k0, k1, k2 = (m.pool.key_of(b) for b in (0, 1, 2))
    m.free(0)  # tail first: the free queue is 3, 2, 1, 0
    assert m.pool.free_queue() == [3, 2, 1, 0]
    q = list(range(100, 116))  # 4 full blocks: takes 3, 2, 1, 0 and evicts k2, k1, k0 in turn
    assert m.admit(1, q, 16, 16).num_cached_tokens == 0
    # k2 entered the CPU tier first: the third key pushes it down to disk
    assert tiers.cpu_keys() == [k1, k0] and tiers.disk_keys() == [k2]
    q_keys = [m.pool.key_of(b) for b in m.block_table(1)]  # q0 q1 q2 q3 on blocks 3 2 1 0
    m.free(1)
    assert m.cached_prefix_tokens(p) == 12  # none on the GPU: 2 blocks in CPU, 1 on disk
    admission = m.admit(2, p, 13, 13)
    assert (admission.num_cached_tokens, admission.cpu_hit_tokens,
            admission.disk_hit_tokens) == (12, 8, 4)
    # every hit is a newly allocated GPU block, keyed again; the 13th token is computed
    assert m.block_table(2) == [0, 1, 2, 3] and m.num_free_blocks == 0
    assert [m.pool.key_of(b) for b in (0, 1, 2)] == [k0, k1, k2]
    # the loads touched k0, k1 (CPU) and k2 (disk); then the 4 blocks taken evicted q3 q2 q1 q0
    # (blocks 0 1 2 3), each pushing the CPU tier's LRU key down and the disk's out
    assert tiers.cpu_keys() == [q_keys[1], q_keys[0]] and tiers.disk_keys() == [q_keys[2]]
    assert tiers.counts() == {"gpu_to_cpu": 7, "cpu_to_disk": 5, "disk_to_cpu": 0, "dropped": 4,
                              "cpu_to_gpu": 2, "disk_to_gpu": 1, "cpu_held": 2, "disk_held": 1}


def test_gpu_hits_come_first_then_the_run_continues_in_the_cpu_tier():
    m = _manager(cpu_blocks=8, disk_blocks=0, num_blocks=8)
    p = list(range(17))  # 4 full blocks
    m.admit(0, p, 17, 17)  # blocks 0..4
    k3 = m.pool.key_of(3)
    m.free(0)  # queue 5, 6, 7, 4, 3, 2, 1, 0
    m.admit(1, list(range(50, 66)), 16, 16)  # takes 5, 6, 7 and 4 (p's partial tail: no key)
    assert m.offload.cpu_keys() == []
    m.admit(2, list(range(60, 64)), 4, 4)  # takes 3: evicts p's 4th block
    assert m.offload.cpu_keys() == [k3]
    m.free(1)
    admission = m.admit(3, p, 17, 17)
    assert (admission.num_cached_tokens, admission.cpu_hit_tokens) == (16, 4)
    assert m.block_table(3)[:3] == [0, 1, 2]  # the GPU hits, touched in place
    assert m.pool.key_of(m.block_table(3)[3]) == k3  # the loaded block, keyed again
    assert m.stats.prefix_hit_tokens == 16


def test_a_loaded_key_stays_in_its_tier_and_is_not_written_again():
    m = _manager(cpu_blocks=4, disk_blocks=0, num_blocks=2)
    p = list(range(5))  # 1 full block + 1 token
    m.admit(0, p, 5, 5)
    kp = m.pool.key_of(0)
    m.free(0)  # queue 1, 0
    m.admit(1, list(range(10, 18)), 8, 8)  # takes 1, 0: evicts kp into the CPU tier
    assert m.offload.cpu_keys() == [kp]
    m.free(1)
    assert m.admit(2, p, 5, 5).cpu_hit_tokens == 4  # loaded into block 0; kp stays in CPU
    assert m.offload.cpu_keys()[0] == kp and m.offload.gpu_to_cpu == 3
    m.free(2)  # queue 1 (no key), 0 (kp)
    m.admit(3, list(range(20, 28)), 8, 8)  # evicts kp again: its CPU copy is there already
    assert m.offload.gpu_to_cpu == 3 and m.offload.cpu_keys()[-1] == kp  # touched, not written


def test_lru_order_load_touch_and_overflow():
    t = OffloadTiers(2, 1)
    t.store([1, 2, 3])  # 1 is pushed down by 3
    assert (t.cpu_keys(), t.disk_keys()) == ([2, 3], [1])
    assert t.match([2, 3, 1, 9]) == 3 and t.match([9, 2]) == 0
    assert t.load([2]) == (1, 0)  # 2 becomes the most recent
    t.store([4])  # the LRU (3) goes down; the disk's 1 is dropped
    assert (t.cpu_keys(), t.disk_keys(), t.dropped) == ([2, 4], [3], 1)
    t.store([3])  # on disk, evicted again from the GPU: back up to the CPU tier
    assert (t.cpu_keys(), t.disk_keys(), t.disk_to_cpu) == ([4, 3], [2], 1)


def test_tier_capacity_in_blocks_from_gib():
    # 64 GiB of 16-token blocks of llama-2-13b (819,200 bytes a slot): 68,719,476,736 B
    # / 13,107,200 B = 5,242.88 -> 5,242 whole blocks; 1 GiB of 2 MiB blocks: exactly 512
    assert OffloadSpec(cpu_gib=64).tier_blocks(16 * 819_200) == (5242, 0)
    assert OffloadSpec(cpu_gib=1, disk_gib=2).tier_blocks(2 * 2**20) == (512, 1024)
    spec = engine_spec(offload=OffloadSpec(cpu_gib=3 * BS * MODEL.bytes_per_slot / GIB))
    result = run(_two_turns(), paged(BS, prefix_caching=True), spec)
    assert result.scheduler.manager.offload.cpu_blocks == 3


# --------------------------------------------------------------------------- the load's time
def test_load_cost_is_bytes_over_bandwidth():
    cost = OffloadLoadCost(bytes_per_slot=131_072, disk_read_gbps=13.0)
    # 16 slots x 131,072 B = 2,097,152 B; CPU over the 25 GB/s host link, disk at 13 GB/s
    assert cost.seconds(16, 0) == pytest.approx(2_097_152 / 25e9, rel=1e-15)
    assert cost.seconds(0, 16) == pytest.approx(2_097_152 / 13e9, rel=1e-15)
    fast_disk = OffloadLoadCost(bytes_per_slot=131_072, disk_read_gbps=40.0)
    assert fast_disk.seconds(0, 16) == pytest.approx(2_097_152 / 25e9, rel=1e-15)  # link-bound


def _two_turns() -> tuple[Request, ...]:
    """A 17-token prompt, a request that evicts it from a 6-block pool, and the prompt again."""
    rng = np.random.default_rng(1)
    p = rng.integers(0, 1 << 20, 17, dtype=np.int32)
    other = rng.integers(0, 1 << 20, 21, dtype=np.int32)
    return (Request(0, 0.0, p, 2), Request(1, 1.0, other, 2), Request(2, 2.0, p.copy(), 2))


def test_the_admitting_step_is_charged_the_load_in_its_own_column():
    spec = engine_spec(kv_capacity_slots=6 * BS, cost=CostSpec(model="operator"),
                       offload=OffloadSpec(cpu_gib=16 * BS * MODEL.bytes_per_slot / GIB))
    result = run(_two_turns(), paged(BS, prefix_caching=True), spec)
    steps = result.recorder.step_table()
    loaded = steps[steps["offload_load_s"] > 0]
    assert len(loaded) == 1
    # request 1 (22 KV slots: all 6 blocks) evicted request 0's 4 cached blocks; request 2
    # loads them back: 16 slots x 512 B over 25 GB/s
    assert loaded["offload_load_s"].iloc[0] == pytest.approx(16 * 512 / 25e9, rel=1e-12)
    phases = [c for c in steps.columns if c.endswith("_s") and c not in ("time_s", "duration_s")]
    assert steps[phases].sum(axis=1).to_numpy() == pytest.approx(steps["duration_s"].to_numpy(),
                                                                 rel=1e-12)
    assert result.scheduler.offload_tokens_cached == {"cpu": 16, "disk": 0}
    # results.json's figures: 4 blocks of 4 slots x 512 B loaded, 16 prompt tokens of the
    # third request's 17 served by the CPU tier; its own load over its own TTFT
    figures = offload_figures(result.scheduler.manager, result.scheduler, spec.offload, BS,
                              MODEL.bytes_per_slot, OffloadLoadCost(MODEL.bytes_per_slot, 13.0))
    requests = result.recorder.request_table()
    summary = offload_summary(figures, steps, requests)
    assert summary["hit_tokens"] == {"gpu": 0, "cpu": 16, "disk": 0}
    assert summary["bytes_moved"]["cpu_to_gpu"] == 4 * BS * 512
    third = requests[requests["request_id"] == 2].iloc[0]
    ttfts = (requests["first_token_s"] - requests["arrival_s"]).to_numpy()
    own = 16 * 512 / 25e9 / (third["first_token_s"] - third["arrival_s"])
    assert summary["request_load_share_of_ttft"]["max"] == pytest.approx(own, abs=1e-6)
    assert summary["load_share_of_ttft"] == pytest.approx(16 * 512 / 25e9 / ttfts.sum(), abs=1e-6)


def test_executor_adds_exactly_the_load_to_the_step():
    from harness.engine.executors import make_executor

    spec = engine_spec(offload=OffloadSpec(cpu_gib=1.0))
    system = paged(16, prefix_caching=True)
    manager = PagedKVCacheManager(64, 16)
    on = make_executor(spec, system, MODEL, HARDWARE, manager)
    off = make_executor(engine_spec(), system, MODEL, HARDWARE, manager)
    group = SequenceGroup(Request(0, 0.0, np.arange(64, dtype=np.int32), 4))
    seq = Sequence(0, group, 0)
    plan = StepPlan()
    plan.add_chunk(ScheduledChunk(seq, 48, 64))
    plan.offload_cpu_slots, plan.offload_disk_slots = 32, 16
    with_load, _ = on.execute(plan)
    without, _ = off.execute(plan)
    hand = 32 * 512 / 25e9 + 16 * 512 / 13e9
    assert with_load - without == pytest.approx(hand, rel=1e-9)
    assert on.load_column == [pytest.approx(hand, rel=1e-15)]


# ------------------------------------------------------------------------------- off = before
def test_offload_off_changes_nothing_and_an_unused_tier_changes_no_figure():
    requests = _two_turns()
    system = paged(BS, prefix_caching=True)
    base = run(requests, system, engine_spec(kv_capacity_slots=64 * BS))
    tier = run(requests, system, engine_spec(kv_capacity_slots=64 * BS,
                                             offload=OffloadSpec(cpu_gib=1.0)))
    assert base.scheduler.manager.offload is None
    assert "offload_load_s" not in base.recorder.step_table()
    a, b = base.recorder.step_table(), tier.recorder.step_table().drop(columns="offload_load_s")
    assert a.equals(b) and base.output_digest == tier.output_digest


# ------------------------------------------------------------------------- property: invariants
@settings(max_examples=60, deadline=None)
@given(cpu=st.integers(1, 6), disk=st.integers(0, 4),
       ops=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 14)), min_size=1, max_size=25))
def test_tiers_never_exceed_capacity_and_a_key_is_in_one_tier(cpu, disk, ops):
    """Random prompts (from 6 families sharing prefixes) admitted into and freed from a
    5-block pool: the tiers hold at most their capacity, the CPU and disk tiers never share a
    key, the counts balance (every key stored is held, moved up, or dropped), and
    ``can_admit`` / ``cached_prefix_tokens`` answer what ``admit`` then does."""
    m = _manager(cpu, disk, num_blocks=5)
    t = m.offload
    live: list[int] = []
    for i, (family, length) in enumerate(ops):
        prompt = [family * 1000 + j for j in range(length)]
        if live and (i % 3 == 2 or m.num_free_blocks < 4):
            m.free(live.pop(0))
        fits, cached = m.can_admit(prompt, length, length), m.cached_prefix_tokens(prompt)
        admission = m.admit(i, prompt, length, length)
        assert (admission is not None) == fits  # can_admit counts the lower-tier hits too
        if admission is not None:
            live.append(i)
            assert admission.num_cached_tokens == cached
            assert admission.cpu_hit_tokens + admission.disk_hit_tokens <= cached
        cpu_keys, disk_keys = t.cpu_keys(), t.disk_keys()
        assert len(cpu_keys) <= cpu and len(disk_keys) <= disk
        assert not set(cpu_keys) & set(disk_keys)
        c = t.counts()
        assert c["cpu_held"] + c["disk_held"] == c["gpu_to_cpu"] - c["disk_to_cpu"] - c["dropped"]


# ------------------------------------------------------------------------------- bad input
SMALL = ["workload=docqa", "workload.num_requests=5", "report=false", "progress=false"]
REFUSED = {
    "negative": (["systems=[paged]", "engine.offload.cpu_gib=-1"],
                 "engine.offload.cpu_gib: must be a number >= 0, got -1"),
    "below_one_block": (["systems=[paged]", "engine.offload.cpu_gib=0.001"],
                        "engine.offload.cpu_gib: 0.001 GiB is smaller than one KV block of paged"),
    "disk_below_one_block": (["systems=[paged]", "engine.offload.cpu_gib=1",
                              "engine.offload.disk_gib=0.0001"],
                             "engine.offload.disk_gib: 0.0001 GiB is smaller than one KV block"),
    "disk_without_cpu": (["systems=[paged]", "engine.offload.disk_gib=8"],
                         "engine.offload.disk_gib: a disk tier (8 GiB) sits behind the CPU tier"),
    "no_prefix_cache": (["systems=[paged_noprefix]", "engine.offload.cpu_gib=8"],
                        "engine.offload.cpu_gib: system paged_noprefix (paged, no prefix cache)"),
    "contiguous": (["systems=[paged,max]", "engine.offload.cpu_gib=8"],
                   "engine.offload.cpu_gib: system max (contiguous) has no block prefix cache"),
    "torch": (["engine=torch", "model=tiny", "systems=[paged]", "engine.offload.cpu_gib=8"],
              "engine.offload.cpu_gib: the offload tier is modelled by the sim executor only"),
    "bad_rate": (["systems=[paged]", "engine.offload.cpu_gib=8", "engine.offload.disk_read_gbps=0"],
                 "engine.offload.disk_read_gbps: must be a positive number, got 0"),
}
THROUGH_THE_CLI = ("below_one_block", "torch")  # the rest are checked in this process


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_offload_config_is_one_config_error_naming_the_key(case):
    from hydra import compose, initialize_config_dir

    from harness.config.conf_tree import CONF_DIR
    from harness.errors import ConfigError
    from harness.run.serve import prepare_serving

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*SMALL, *REFUSED[case][0]])
    with pytest.raises(ConfigError) as refused:
        prepare_serving(cfg)
    assert REFUSED[case][1] in str(refused.value) and "\n" not in str(refused.value)


@pytest.fixture(scope="module")
def refused_runs(tmp_path_factory, run_cli):
    base = tmp_path_factory.mktemp("offload_refused")
    procs = {name: run_cli.start(base / name, *SMALL, *REFUSED[name][0]) for name in THROUGH_THE_CLI}
    return {name: (run_cli.wait(proc), base / name) for name, proc in procs.items()}


@pytest.mark.parametrize("case", THROUGH_THE_CLI)
def test_bad_offload_config_exits_2_with_one_line(refused_runs, case):
    result, run_dir = refused_runs[case]
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and REFUSED[case][1] in errors[0], result.output
    written = {p.name for p in run_dir.iterdir()} if run_dir.exists() else set()
    assert "results.json" not in written


def test_fast_forward_stays_exact_with_the_tier():
    """Every step row (clock and load column included) of the bulk-decoding run equals the
    step-by-step run's, on a pool small enough that decodes evict cached blocks to the tier."""
    rng = np.random.default_rng(3)
    prefix = rng.integers(0, 1 << 20, 40, dtype=np.int32)
    lengths = [(int(rng.integers(41, 90)), int(rng.integers(5, 40))) for _ in range(24)]
    requests = make_requests(lengths, gap=0.002, prefix=prefix, seed=5)
    system = paged(BS, prefix_caching=True)
    tier = OffloadSpec(cpu_gib=12 * BS * MODEL.bytes_per_slot / GIB,
                       disk_gib=8 * BS * MODEL.bytes_per_slot / GIB)
    bulk, steps = (run(requests, system, engine_spec(kv_capacity_slots=64 * BS, offload=tier,
                                                     fast_forward=ff)) for ff in (True, False))
    a, b = bulk.recorder.step_table(), steps.recorder.step_table()
    assert a.equals(b)
    assert bulk.scheduler.offload_tokens_cached == steps.scheduler.offload_tokens_cached
    assert bulk.scheduler.offload_tokens_cached["cpu"] > 0  # the tier served hits
    assert bulk.scheduler.manager.offload.counts() == steps.scheduler.manager.offload.counts()
