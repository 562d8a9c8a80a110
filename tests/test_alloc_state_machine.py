"""Hypothesis state machines: random admit / append / fork / free / swap on each manager,
checked after every step against a reference model of what every slot holds
(tests/alloc_model.py)."""

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from alloc_model import ContiguousModel, PagedModel

SETTINGS = settings(max_examples=40, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
ALPHABET = st.integers(0, 2)  # few distinct ids, so prompts share prefixes and blocks repeat
PREFIXES = [[], [1] * 8, [1, 2, 0, 1, 2, 0, 1, 2, 0, 1], [2, 2, 2, 2, 0, 0, 0, 0, 1]]


class _ManagerMachine(RuleBasedStateMachine):
    """Rules every manager shares; ``self.model`` performs and checks each operation."""

    model: PagedModel | ContiguousModel
    MAX_APPEND = 8  # tokens at most in one append

    def resident(self):
        return self.model.resident()

    def draw_tokens(self, data, k):
        return data.draw(st.lists(ALPHABET, min_size=k, max_size=k))

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def append(self, data):
        sid = data.draw(st.sampled_from(self.resident()))
        room = self.model.room(sid)
        if room == 0:
            self.model.refuse_append_when_full(sid)
            return
        k = data.draw(st.integers(1, min(room, self.MAX_APPEND)))
        toks = self.model.next_tokens(sid, k, lambda n: self.draw_tokens(data, n))
        self.model.append(sid, toks, **self.append_options(k))

    def append_options(self, k):
        return {}

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def append_batch(self, data):
        """Several tokens each for several sequences in one call."""
        self.append_many(data, decode=False)

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def append_decode(self, data):
        """One token each for several sequences in one call."""
        self.append_many(data, decode=True)

    def append_many(self, data, decode):
        open_ids = self.model.open_ids()
        if not open_ids:
            return
        sids = data.draw(st.lists(st.sampled_from(open_ids), min_size=1, unique=True))
        toks = [self.model.next_tokens(
                    sid, 1 if decode else data.draw(st.integers(1, self.batch_room(sid))),
                    lambda n: self.draw_tokens(data, n))
                for sid in sids]
        self.model.append_many(sids, toks, decode=decode)

    def batch_room(self, sid):
        return self.model.room(sid)

    @precondition(lambda self: self.model.seqs)
    @rule(data=st.data())
    def free(self, data):
        self.model.free(data.draw(st.sampled_from(sorted(self.model.seqs))))

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def swap_out(self, data):
        self.model.swap_out(data.draw(st.sampled_from(self.resident())))

    @precondition(lambda self: self.model.swapped())
    @rule(data=st.data())
    def swap_in(self, data):
        self.model.swap_in(data.draw(st.sampled_from(self.model.swapped())))


# --------------------------------------------------------------------- paged
class PagedMachine(_ManagerMachine):
    BS, NUM_BLOCKS, NUM_CPU = 4, 12, 6
    MAX_APPEND = 2 * BS
    caching = True

    def __init__(self):
        super().__init__()
        self.model = PagedModel(self.NUM_BLOCKS, self.BS, self.NUM_CPU, self.caching)

    def append_options(self, k):
        return {"as_array": k > 1}

    def batch_room(self, sid):
        return min(self.model.room(sid), 2 * self.BS)

    @rule(data=st.data())
    def admit(self, data):
        # Prompts often continue a shared prefix or an earlier sequence (a next chat turn),
        # so that prefix hits, including on decode-produced blocks, are common.
        heads = PREFIXES + self.model.history[-4:]
        prompt = data.draw(st.sampled_from(heads)) + data.draw(st.lists(ALPHABET, max_size=10))
        prompt = prompt[:24] or [0]
        final = len(prompt) + data.draw(st.integers(0, 12))
        num = data.draw(st.integers(1, len(prompt)))
        self.model.admit(prompt, final, num, as_array=data.draw(st.booleans()))

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.resident()))
        n = len(self.model.seqs[parent]["tokens"])
        self.model.fork(parent, n + data.draw(st.integers(0, 10)))

    @invariant()
    def blocks_refcounts_and_contents_agree_with_the_model(self):
        self.model.check_blocks()

    @invariant()
    def breakdown_matches_a_from_scratch_recomputation(self):
        self.model.check_breakdown()


class PagedNoCachingMachine(PagedMachine):
    caching = False


TestPagedWithPrefixCaching = PagedMachine.TestCase
TestPagedWithPrefixCaching.settings = SETTINGS
TestPagedWithoutPrefixCaching = PagedNoCachingMachine.TestCase
TestPagedWithoutPrefixCaching.settings = SETTINGS


# ---------------------------------------------------------------- contiguous
class ContiguousMachine(_ManagerMachine):
    CAPACITY, MAX_LEN, NUM_CPU = 200, 48, 60  # 200 = buddy roots 128 + 64 + 8
    policy, arena = "pow2", "buddy"

    def __init__(self):
        super().__init__()
        self.model = ContiguousModel(self.CAPACITY, self.policy, self.arena, self.NUM_CPU,
                                     self.MAX_LEN)

    @rule(data=st.data())
    def admit(self, data):
        plen = data.draw(st.integers(1, 20))
        final = plen + data.draw(st.integers(0, self.MAX_LEN - plen))
        num = data.draw(st.integers(1, plen))
        self.model.admit(self.draw_tokens(data, plen), final, num)

    @precondition(lambda self: self.resident())
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.resident()))
        p = self.model.seqs[parent]
        n = len(p["tokens"])
        final = n + data.draw(st.integers(0, max(0, self.MAX_LEN - n)))
        self.model.fork(parent, max(final, len(p["prompt"])))

    @invariant()
    def extents_are_disjoint_and_hold_the_written_tokens(self):
        self.model.check_extents()

    @invariant()
    def breakdown_matches_a_from_scratch_recomputation(self):
        self.model.check_breakdown()


_CONTIGUOUS_CASES = [(p, a) for p in ("max", "pow2", "oracle")
                     for a in ("buddy", "first_fit", "best_fit")]
for _policy, _arena in _CONTIGUOUS_CASES:
    _machine = type(f"Contiguous_{_policy}_{_arena}", (ContiguousMachine,),
                    {"policy": _policy, "arena": _arena})
    _case = _machine.TestCase
    _case.settings = settings(SETTINGS, max_examples=12, stateful_step_count=25)
    globals()[f"TestContiguous_{_policy}_{_arena}"] = _case
del _policy, _arena, _machine, _case
