"""The paged manager's token sources (``set_token_source``: a sequence's ids read when a
block fills, its appends' ids only counted) against the ids given with every append: a
hypothesis state machine drives two managers with the same admissions, forks, frees,
swaps and appends (single, ``append_decode``, ``append_batch``). One is given every id;
on the other every sequence has a token source (a child forked from one gets its own,
now or after some appends with the real ids) and its appends get None or wrong ids of
the right count. After every step they agree on everything (block tables, keys, the
pool's free queue, ref counts, cache map and eviction log, the ledger, the residency
samples, the offload tier) but the tails, where the one with sources holds a prefix of
the ids the other holds: the ids it has not read yet.

Few token ids and tiny blocks make decode-produced blocks repeat cached keys (prefix
hits, the batch's fall back to single appends).
"""

from __future__ import annotations

from array import array

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from test_alloc_paged_batch import TOKENS, TwinManagers, _state


class SourcesAgainstGivenIds(TwinManagers):
    """``first`` (``sourced``) reads its sequences' ids from token sources, ``second``
    (``given``) is given every id."""

    num_blocks, bs = 16, 4

    def __init__(self):
        super().__init__()
        self.sourced, self.given = self.first, self.second
        self.streams: dict[int, list[int]] = {}  # seq id -> its ids (positions 0 ..)
        self.with_source: set[int] = set()  # sequences the sourced manager reads from

    def give_source(self, sid: int) -> None:
        stream = self.streams[sid]

        def source(start: int, end: int) -> bytes:
            return array("i", stream[start:end]).tobytes()

        self.sourced.set_token_source(sid, source)
        self.with_source.add(sid)

    def admitted(self, sid: int, prompt: list[int]) -> None:
        self.streams[sid] = list(prompt)
        self.give_source(sid)

    def forked(self, data, parent: int, sid: int, held: int) -> None:
        self.streams[sid] = self.streams[parent][:held]  # then its own ids
        if data.draw(st.booleans()):  # its source now (else a later rule gives it one)
            self.give_source(sid)

    def freed(self, sid: int) -> None:
        del self.streams[sid]
        self.with_source.discard(sid)

    def next_ids(self, data, sid: int, k: int) -> list[int]:
        """The ``k`` ids ``sid`` writes next (extending its stream up to them)."""
        stream, at = self.streams[sid], self.given.num_tokens(sid)
        if len(stream) < at + k:
            if data.draw(st.booleans()):  # a run of consecutive ids
                first = data.draw(st.integers(0, 50))
                stream += range(first, first + at + k - len(stream))
            else:
                stream += data.draw(st.lists(TOKENS, min_size=at + k - len(stream),
                                             max_size=at + k - len(stream)))
        return stream[at:at + k]

    def ids_for_sourced(self, sid: int, ids: list[int]):
        """What the sourced manager's append gets: wrong ids of the right count."""
        return [7] * len(ids) if sid in self.with_source else ids

    @precondition(lambda self: [sid for sid in self.finals if sid not in self.with_source])
    @rule(data=st.data())
    def give_a_forked_child_its_source(self, data):
        self.give_source(data.draw(st.sampled_from(
            sorted(sid for sid in self.finals if sid not in self.with_source))))

    @precondition(lambda self: self.open_ids())
    @rule(data=st.data())
    def look_ahead(self, data):
        """``filled_block_keys`` of ids not appended yet (the stream's next ones)."""
        sid = data.draw(st.sampled_from(self.open_ids()))
        room = self.finals[sid] - self.given.num_tokens(sid)
        ids = self.next_ids(data, sid, data.draw(st.integers(1, room)))
        self.both("filled_block_keys", sid, ids)

    @precondition(lambda self: self.open_ids())
    @rule(data=st.data(), form=st.sampled_from(["append", "decode", "batch"]))
    def append_some(self, data, form):
        self.tick()
        sids = data.draw(st.lists(st.sampled_from(self.open_ids()), min_size=1, unique=True))
        if form == "append":
            sids = sids[:1]
        lists = []
        for sid in sids:
            room = self.finals[sid] - self.given.num_tokens(sid)
            k = 1 if form == "decode" else data.draw(st.integers(1, min(room, 3 * self.bs)))
            lists.append(self.next_ids(data, sid, k))
        wrong = [self.ids_for_sourced(sid, ids) for sid, ids in zip(sids, lists)]
        if form == "append":
            assert self.sourced.append(sids[0], wrong[0]) == self.given.append(sids[0], lists[0])
        elif form == "decode":
            copies, given_copies = [], []
            sourced_ids = None if set(sids) <= self.with_source else [ids[0] for ids in wrong]
            done = self.sourced.append_decode(sids, sourced_ids, copies)
            assert self.given.append_decode(sids, [ids[0] for ids in lists], given_copies) == done
            assert copies == given_copies
        else:
            copies, given_copies = [], []
            done = self.sourced.append_batch(sids, wrong, copies)
            assert self.given.append_batch(sids, lists, given_copies) == done
            assert copies == given_copies

    @invariant()
    def both_managers_hold_the_same_state_but_for_unread_ids(self):
        given, sourced = _state(self.given), _state(self.sourced)
        for sid, entry in given["seqs"].items():
            keyed = len(entry[3]) * self.bs  # the positions keyed (entry: table, tokens, final, keys, tail, ...)
            assert entry[4] == self.streams[sid][keyed:entry[1]]  # the given tail: every id
            read = sourced["seqs"][sid][4]
            assert read == entry[4][:len(read)]  # the sourced: the first of them
            if sid not in self.with_source:
                assert read == entry[4]  # no source: it has every id
        for state in (given, sourced):
            state["seqs"] = {sid: entry[:4] + entry[5:] for sid, entry in state["seqs"].items()}
        assert given == sourced


class SourcesAgainstGivenIdsBlocksOf2(SourcesAgainstGivenIds):
    """Blocks of 2 tokens: a decode-produced block often repeats a cached key."""
    num_blocks, bs = 24, 2


SETTINGS = settings(max_examples=80, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestSourcesAgainstGivenIds = SourcesAgainstGivenIds.TestCase
TestSourcesAgainstGivenIds.settings = SETTINGS
TestSourcesAgainstGivenIdsBlocksOf2 = SourcesAgainstGivenIdsBlocksOf2.TestCase
TestSourcesAgainstGivenIdsBlocksOf2.settings = SETTINGS
