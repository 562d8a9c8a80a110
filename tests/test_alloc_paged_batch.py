"""The paged manager's batch appends (``append_batch``, ``append_decode``) against
``append`` one sequence after the other: a hypothesis state machine drives two managers
with the same admissions, forks, frees and swaps, and each batch append on one of them is
made on the other as single ``append`` calls (stopping at the first that does not fit).
After every step the two agree on everything: block tables, keys and tails, the pool's
free queue, ref counts, cache map and eviction log, the partial-block ledger, the
residency samples and the offload tier.

Few token ids and tiny blocks make decode-produced blocks repeat cached keys, so the
batch path's fall back to single appends (a key the batch's allocation may evict) is
exercised too, as are copy-on-write appends among the batched ones (after forks); the
case that fall back exists for is ``test_a_filled_block_whose_key_...`` below.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagebench.allocators.offload_tier import OffloadTiers
from pagebench.allocators.registry import PagedKVCacheManager
from pagebench.allocators.residency import ResidencyLog

NUM_CPU = 8
TOKENS = st.integers(0, 1)  # two ids: keys repeat often
PREFIXES = [[], [1, 1, 1, 1], [0, 1, 0, 1, 0, 1]]


def _manager(num_blocks: int, block_size: int, caching: bool) -> PagedKVCacheManager:
    m = PagedKVCacheManager(num_blocks, block_size, enable_prefix_caching=caching,
                            num_cpu_blocks=NUM_CPU)
    m.attach_residency(ResidencyLog(num_blocks))
    if caching:
        m.attach_offload(OffloadTiers(4, 2))
    return m


def _state(m: PagedKVCacheManager) -> dict:
    """Everything the manager holds that a later call or a figure can depend on."""
    pool, ledger, log = m.pool, m._ledger, m.pool.residency
    return {
        "seqs": {sid: (s.table, s.num_tokens, s.final_len, s.keys, s.tail.tolist(), s.room,
                       s.cpu_blocks, s.known is not None)
                 for sid, s in m._seqs.items()},
        "queue": pool.free_queue(), "ref": pool.ref_cnt.tolist(), "keys": list(pool._keys),
        "cached": dict(pool._cached), "held": bytes(pool._held),
        "counts": (pool.num_free, pool.num_cached_free, pool.num_evictions, m._logical),
        "evicted": pool.evicted_since(0),
        "ledger": (ledger.sole, ledger.shared, ledger.fill_sum, ledger.target_sum, ledger.count,
                   ledger.num_shared),
        "residency": (log.lifetimes.tolist(), log.idle_before_evict.tolist(),
                      log.reuse_gaps.tolist(), log._since.tolist()),
        "offload": (m.offload.cpu_keys(), m.offload.disk_keys()) if m.offload else None,
        "breakdown": m.breakdown(False),
    }


class TwinManagers(RuleBasedStateMachine):
    """Two paged managers, ``first`` and ``second``, driven by the same admissions, forks,
    frees and swaps (``both``: the second must answer as the first did); ``finals``: the
    open sequences' final lengths. A subclass adds its appends and its invariant, and
    keeps its own records through ``admitted``, ``forked`` and ``freed``."""

    num_blocks, bs, caching = 16, 4, True

    def __init__(self):
        super().__init__()
        self.first = _manager(self.num_blocks, self.bs, self.caching)
        self.second = _manager(self.num_blocks, self.bs, self.caching)
        self.finals: dict[int, int] = {}  # seq id -> final_len
        self.next_id = 0
        self.clock = 0.0

    def both(self, op: str, *args):
        result = getattr(self.first, op)(*args)
        assert getattr(self.second, op)(*args) == result
        return result

    def tick(self) -> None:
        self.clock += 1.0
        self.first.pool.residency.now = self.second.pool.residency.now = self.clock

    def open_ids(self) -> list[int]:
        return [sid for sid, final in self.finals.items()
                if sid in self.first and not self.first.is_swapped(sid)
                and self.first.num_tokens(sid) < final]

    def admitted(self, sid: int, prompt: list[int]) -> None:
        """``sid`` was admitted with ``prompt``."""

    def forked(self, data, parent: int, sid: int, held: int) -> None:
        """``sid`` was forked from ``parent``, which held ``held`` tokens."""

    def freed(self, sid: int) -> None:
        """``sid`` was freed."""

    @rule(data=st.data())
    def admit(self, data):
        self.tick()
        prompt = data.draw(st.sampled_from(PREFIXES)) + data.draw(st.lists(TOKENS, max_size=7))
        prompt = prompt or [0]
        final = len(prompt) + data.draw(st.integers(0, 12))
        num = data.draw(st.integers(1, len(prompt)))
        sid, self.next_id = self.next_id, self.next_id + 1
        if self.both("admit", sid, prompt, final, num) is not None:
            self.finals[sid] = final
            self.admitted(sid, prompt)

    @precondition(lambda self: self.open_ids())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.open_ids()))
        held = self.first.num_tokens(parent)
        final = held + data.draw(st.integers(0, 8))
        sid, self.next_id = self.next_id, self.next_id + 1
        self.both("fork", parent, sid, final)
        self.finals[sid] = final
        self.forked(data, parent, sid, held)

    @precondition(lambda self: self.finals)
    @rule(data=st.data())
    def free(self, data):
        self.tick()
        sid = data.draw(st.sampled_from(sorted(self.finals)))
        self.both("free", sid)
        del self.finals[sid]
        self.freed(sid)

    @precondition(lambda self: self.open_ids())
    @rule(data=st.data())
    def swap_out_and_in(self, data):
        sid = data.draw(st.sampled_from(self.open_ids()))
        if self.both("swap_out", sid) is not None and data.draw(st.booleans()):
            self.both("swap_in", sid)


class BatchAgainstSingleAppends(TwinManagers):
    """``first`` (``batch``) gets append_batch / append_decode, ``second`` (``single``) the
    same as single appends."""

    def __init__(self):
        super().__init__()
        self.batch, self.single = self.first, self.second

    @precondition(lambda self: self.open_ids())
    @rule(data=st.data(), decode=st.booleans(), span=st.booleans())
    def append_many(self, data, decode, span):
        """A batch append, and the same as single appends; in a fast-forward ``span`` the
        residency log takes each allocation's times from lists."""
        self.tick()
        sids = data.draw(st.lists(st.sampled_from(self.open_ids()), min_size=1, unique=True))
        toks = []
        for sid in sids:
            room = self.finals[sid] - self.batch.num_tokens(sid)
            k = 1 if decode else data.draw(st.integers(1, min(room, 3 * self.bs)))
            tokens = data.draw(st.lists(TOKENS, min_size=k, max_size=k))
            toks.append(range(tokens[0], tokens[0] + k) if data.draw(st.booleans()) else tokens)
        if span:
            times = data.draw(st.lists(st.floats(0, 100), min_size=2, max_size=2))
            for m in (self.batch, self.single):
                m.pool.residency.span([times[0] + i for i in range(99)],
                                      [times[1] + i for i in range(99)])
        copies: list = []
        if decode:
            done = self.batch.append_decode(sids, [t[0] for t in toks], copies)
        else:
            done = self.batch.append_batch(sids, toks, copies)
        single_copies: list = []
        single_done = 0
        for sid, tokens in zip(sids, toks):
            got = self.single.append(sid, tokens)
            if got is None:
                break
            single_copies += got
            single_done += 1
        assert (done, copies) == (single_done, single_copies)
        if span:
            for m in (self.batch, self.single):
                m.pool.residency.end_span(self.clock)

    @invariant()
    def both_managers_hold_the_same_state(self):
        assert _state(self.batch) == _state(self.single)


class BatchAgainstSingleAppendsBlocksOf2(BatchAgainstSingleAppends):
    """Blocks of 2 tokens: a decode-produced block often repeats a cached key."""
    num_blocks, bs = 24, 2


class BatchAgainstSingleAppendsNoCaching(BatchAgainstSingleAppends):
    caching = False


SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestBatchAgainstSingleAppends = BatchAgainstSingleAppends.TestCase
TestBatchAgainstSingleAppends.settings = SETTINGS
TestBatchAgainstSingleAppendsBlocksOf2 = BatchAgainstSingleAppendsBlocksOf2.TestCase
TestBatchAgainstSingleAppendsBlocksOf2.settings = SETTINGS
TestBatchAgainstSingleAppendsNoCaching = BatchAgainstSingleAppendsNoCaching.TestCase
TestBatchAgainstSingleAppendsNoCaching.settings = SETTINGS


def test_a_filled_block_whose_key_the_batch_evicts_stays_unregistered_as_in_single_appends():
    """B fills a block with the key a free cached block holds, and C, later in the same
    batch, takes that free block (evicting the key): one after the other, B's block is
    not registered (the key was taken), then the key is gone. The batch must not
    register B's block after its one allocation has evicted the key."""
    managers = []
    for _ in range(2):
        m = PagedKVCacheManager(8, 4, num_cpu_blocks=0)
        m.attach_residency(ResidencyLog(8))
        m.admit(0, [1, 2, 3, 4, 5, 6, 7, 8], 8, 8)  # blocks 0, 1: keys of [1..4], [1..8]
        m.free(0)  # free queue: 2 .. 7, 1, 0 (both still cached)
        m.admit(1, list(range(100, 116)), 16, 16)  # blocks 2 .. 5
        m.admit(2, [1, 2, 3, 4, 5, 6, 7], 12, 7)  # hits block 0; takes block 6
        m.admit(3, [50, 51, 52, 53], 12, 4)  # block 7; the queue is [1]
        assert m.pool.free_queue() == [1] and m.pool.key_of(1) is not None
        managers.append(m)
    batch, single = managers
    assert batch.append_decode([2, 3], [8, 54], []) == 2
    assert single.append(2, [8]) == [] and single.append(3, [54]) == []
    assert single.pool.key_of(6) is None and single.pool.key_of(1) is None
    assert _state(batch) == _state(single)
