"""``PartialBlockLedger`` (sole owners kept apart from shared blocks) against the sums
recomputed from every partial block's owners."""

from hypothesis import given, settings
from hypothesis import strategies as st

from pagebench.allocators.accounting import PartialBlockLedger

BS = 8


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, BS - 1), st.integers(1, BS),
                          st.booleans()), max_size=60))
def test_sums_are_those_of_the_owners_through_forks_and_frees(ops):
    """Each op adds an owner to block ``b`` (a new partial block with fill ``f``, or a fork
    joining it) or removes one of its owners; the sums always equal the brute-force ones."""
    ledger = PartialBlockLedger(BS)
    owners: dict[int, list[int]] = {}  # block -> its owners' targets
    fills: dict[int, int] = {}
    for block, fill, target, add in ops:
        if add:
            fill = fills.setdefault(block, fill)
            target = max(target, fill)
            ledger.add_owner(block, fill, target)
            owners.setdefault(block, []).append(target)
        elif block in owners:
            target = owners[block].pop(0)
            ledger.remove_owner(block, fills[block], target)
            if not owners[block]:
                del owners[block], fills[block]
        assert ledger.fill_sum == sum(fills.values())
        assert ledger.target_sum == sum(max(t) for t in owners.values())
        assert ledger.count == len(owners)
        assert ledger.num_shared == sum(len(t) > 1 for t in owners.values())
        assert ledger.sole == {b: t[0] for b, t in owners.items() if len(t) == 1}
        assert {b: sorted(t) for b, t in ledger.shared.items()} == {
            b: sorted(t) for b, t in owners.items() if len(t) > 1}
