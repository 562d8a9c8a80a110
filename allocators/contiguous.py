"""Contiguous KV reservation (the Orca / FasterTransformer style baselines).

At admit a sequence reserves one extent of the linear slot space for its whole
life, sized by the policy, and placed by an arena (``pagebench.allocators.arena``):

- ``max``: ``max_model_len`` slots.
- ``pow2``: the prompt plus the true output length rounded up to a power of two.
  With ``output_len = final_len - prompt_len + 1`` (the last output token's KV is
  never written), the reservation is
  ``min(max_model_len, prompt_len + next_pow2(output_len) - 1)``: the output part
  holds ``next_pow2(output_len) - 1`` slots for the ``output_len - 1`` it needs,
  fewer than 2x (output 25 -> 32 output tokens -> 31 output KV slots for 24).
- ``oracle``: exactly ``final_len``.

Appends only advance the write position (no allocation, never None). Fork makes a
new reservation for the child and returns per-slot copies of the parent's written
slots. Swap-out moves the written slots into a first-fit CPU slot space of
``num_cpu_slots`` and frees the extent; swap-in places the reservation again
(possibly elsewhere) and returns the copies back.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from pagebench.allocators.accounting import ExtentLedger
from pagebench.allocators.arena import ARENAS, FirstFitArena, make_arena
from pagebench.allocators.base import Admission, Capabilities, ManagerStats, MemoryBreakdown, register_manager

POLICIES = ("max", "pow2", "oracle")
_ADMITTED = Admission(num_cached_tokens=0)  # every admission's (no prefix cache), made once


class _Res:
    __slots__ = ("start", "taken", "reservation", "final_len", "prompt_len", "written", "cpu_start")

    def __init__(self, start: int, taken: int, reservation: int, final_len: int,
                 prompt_len: int, written: int) -> None:
        self.start = start  # first slot of the extent (None while swapped out)
        self.taken = taken  # slots the arena took (reservation, rounded by buddy)
        self.reservation = reservation  # slots the policy asked for
        self.final_len = final_len
        self.prompt_len = prompt_len
        # slots written so far, less the manager's ``_shift`` (``advance_all``)
        self.written = written
        self.cpu_start: int | None = None  # first CPU slot while swapped out


@register_manager("contiguous")
class ContiguousKVCacheManager:
    """One reserved extent per sequence in ``capacity_slots`` slots."""

    options: tuple[str, ...] = ()  # no keys of its own beyond SystemSpec's
    tensor_layout = "contiguous"
    uses_block_size = False  # takes the top-level block_size when its entry gives none

    @classmethod
    def from_system(cls, system, capacity_slots: int, cpu_slots: int, max_model_len: int,
                    model) -> "ContiguousKVCacheManager":
        """The catalog entry ``kind: contiguous`` (``policy``, ``arena``)."""
        return cls(capacity_slots, policy=system.policy, max_model_len=max_model_len,
                   arena=system.arena, num_cpu_slots=cpu_slots)

    @staticmethod
    def system_problem(system, model) -> tuple[str, str] | None:
        if system.policy not in POLICIES:
            return "policy", f"must be max, pow2 or oracle, got {system.policy!r}"
        if system.arena not in ARENAS:
            return "arena", f"must be buddy, first_fit or best_fit, got {system.arena!r}"
        return None

    @staticmethod
    def label(system) -> str:
        return f"contiguous {system.policy} ({system.arena})"

    @staticmethod
    def kernel_layout(system, model) -> tuple[str, int | None]:
        """The decode kernel's layout the cost model prices: one contiguous range per sequence."""
        return "contiguous", None

    def __init__(self, capacity_slots: int, *, policy: str, max_model_len: int,
                 arena: str = "buddy", num_cpu_slots: int = 0, name: str | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown reservation policy {policy!r}; choose one of {list(POLICIES)}")
        if arena not in ARENAS:
            raise ValueError(f"unknown arena {arena!r}; choose one of {sorted(ARENAS)}")
        if not isinstance(capacity_slots, int) or capacity_slots <= 0:
            raise ValueError(f"capacity_slots must be a positive int, got {capacity_slots!r}: "
                             "the pool needs at least one slot")
        if not isinstance(max_model_len, int) or max_model_len <= 0:
            raise ValueError(f"max_model_len must be a positive int, got {max_model_len!r}")
        if not isinstance(num_cpu_slots, int) or num_cpu_slots < 0:
            raise ValueError(f"num_cpu_slots must be an int >= 0, got {num_cpu_slots!r}")
        self.name = name if name is not None else f"contiguous_{policy}"
        self.policy = policy
        self.arena_kind = arena
        self.max_model_len = max_model_len
        self.capacity_slots = capacity_slots
        self.num_cpu_slots = num_cpu_slots
        self.arena = make_arena(arena, capacity_slots)
        self._cpu = FirstFitArena(num_cpu_slots) if num_cpu_slots else None
        self.stats = ManagerStats()
        self.capabilities = Capabilities(layout=self.tensor_layout, batched_decode=True,
                                         bulk_decode="contiguous", reads_decode_tokens=False,
                                         knows_final_len=policy != "max")
        self._seqs: dict[int, _Res] = {}
        # NOTE: ``advance_all`` appends to every sequence in O(1) by adding to ``_shift``:
        # a sequence has written ``_Res.written + _shift`` slots. It refuses while one is
        # swapped out (``_num_swapped``), so a swapped record never moves.
        self._shift = 0
        self._num_swapped = 0
        self._ledger = ExtentLedger()

    # ---------------------------------------------------------------- queries
    def reservation(self, prompt_len: int, final_len: int) -> int:
        """Slots the policy reserves for a sequence (before arena rounding)."""
        if self.policy == "max":
            return self.max_model_len
        if self.policy == "oracle":
            return final_len
        output_len = final_len - prompt_len + 1
        return min(self.max_model_len, prompt_len + (1 << (output_len - 1).bit_length()) - 1)

    def cached_prefix_tokens(self, prompt_token_ids: Sequence[int]) -> int:
        """Contiguous reservations share nothing: always 0."""
        return 0

    def member_slots(self, prompt_len: int, final_len: int) -> int:
        return self.arena.taken_size(self.reservation(prompt_len, final_len))

    def fits_empty_pool(self, prompt_len: int, final_len: int) -> bool:
        if final_len > self.max_model_len or final_len < prompt_len or prompt_len < 1:
            return False
        size = self.arena.taken_size(self.reservation(prompt_len, final_len))
        return size <= self.arena.max_allocation()

    def _get(self, seq_id: int) -> _Res:
        r = self._seqs.get(seq_id)
        if r is None:
            raise ValueError(f"unknown seq_id {seq_id!r}: admit it (or fork into it) first")
        return r

    def _get_resident(self, seq_id: int, what: str) -> _Res:
        r = self._get(seq_id)
        if r.cpu_start is not None:
            raise ValueError(f"cannot {what} seq {seq_id}: it is swapped out; swap_in it first")
        return r

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def num_tokens(self, seq_id: int) -> int:
        return self._get(seq_id).written + self._shift

    def is_swapped(self, seq_id: int) -> bool:
        return self._get(seq_id).cpu_start is not None

    def slot_range(self, seq_id: int) -> tuple[int, int]:
        """``(start, reservation)``: the slots this sequence may write, from its first."""
        r = self._get_resident(seq_id, "get the slot range of")
        return r.start, r.reservation

    def slot_mapping(self, seq_id: int, start: int, end: int) -> list[int]:
        r = self._get_resident(seq_id, "map slots of")
        written = r.written + self._shift
        if not 0 <= start <= end <= written:
            raise ValueError(f"slot range [{start}, {end}) is outside the {written} tokens "
                             f"written by seq {seq_id}; append the tokens first")
        return list(range(r.start + start, r.start + end))

    @property
    def num_free_slots(self) -> int:
        return self.arena.free_slots

    @property
    def usage(self) -> float:
        return 1.0 - self.arena.free_slots / self.capacity_slots

    # ----------------------------------------------------------- life cycle
    def _check_new(self, seq_id: int, prompt_len: int, final_len: int) -> None:
        if seq_id in self._seqs:
            raise ValueError(f"seq_id {seq_id!r} is already admitted: free it first or use a new id")
        if final_len < prompt_len:
            raise ValueError(f"seq {seq_id}: final_len {final_len} < prompt length {prompt_len}; "
                             "pass final_len = prompt_len + output_len - 1")
        if final_len > self.max_model_len:
            raise ValueError(f"seq {seq_id}: final_len {final_len} exceeds max_model_len "
                             f"{self.max_model_len}; reject it (fits_empty_pool is False) or "
                             "raise max_model_len")

    def can_admit(self, prompt_token_ids: Sequence[int], final_len: int, num_tokens: int) -> bool:
        """Would ``admit`` succeed now: does the arena have room for the reservation?"""
        reservation = self.reservation(len(prompt_token_ids), final_len)
        return self.arena.largest_free_extent() >= self.arena.taken_size(reservation)

    def admit(self, seq_id: int, prompt_token_ids: Sequence[int], final_len: int,
              num_tokens: int) -> Admission | None:
        """Reserve the whole extent now and mark the first ``num_tokens`` slots written.

        No prefix cache: ``num_cached_tokens`` is always 0.
        """
        prompt_len = len(prompt_token_ids)
        if prompt_len < 1:
            raise ValueError(f"seq {seq_id}: empty prompt; every request needs >= 1 prompt token")
        self._check_new(seq_id, prompt_len, final_len)
        if not 1 <= num_tokens <= prompt_len:
            raise ValueError(f"seq {seq_id}: num_tokens {num_tokens} must be in [1, {prompt_len}] "
                             "(the prompt tokens to hold after this step)")
        r = self._place(prompt_len, final_len, num_tokens)
        if r is None:
            return None
        self._seqs[seq_id] = r
        return _ADMITTED

    def _place(self, prompt_len: int, final_len: int, written: int) -> _Res | None:
        reservation = self.reservation(prompt_len, final_len)
        start = self.arena.allocate(reservation)
        if start is None:
            return None
        r = _Res(start, self.arena.size_of(start), reservation, final_len, prompt_len,
                 written - self._shift)
        self._ledger.add(written, final_len, reservation, r.taken)
        return r

    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[tuple[int, int]]:
        """Advance the write position; the slots are already reserved, so always ``[]``."""
        r = self._get_resident(seq_id, "append to")
        k = len(token_ids)
        written = r.written + self._shift
        if written + k > r.final_len:
            raise ValueError(f"seq {seq_id}: appending {k} tokens to {written} exceeds its "
                             f"final_len {r.final_len}; the sequence must end (free it) instead")
        r.written += k
        self._ledger.written += k
        return []

    def append_decode(self, seq_ids: Sequence[int], token_ids: Iterable[int] | None,
                      copies: list[tuple[int, int]]) -> int:
        """One decode step: ``append(seq_id, [token])`` for each sequence, in order, in one
        call. Never short of memory, so it returns ``len(seq_ids)``; no copies, and the
        token ids are not read (a contiguous extent keys nothing on them:
        ``Capabilities.reads_decode_tokens`` is False, the scheduler passes None)."""
        seqs, shift = self._seqs, self._shift
        done = 0
        try:
            for seq_id in seq_ids:
                r = seqs.get(seq_id)
                if r is None or r.cpu_start is not None:
                    self._get_resident(seq_id, "append to")  # raises the right error
                written = r.written
                if written + shift >= r.final_len:
                    raise ValueError(f"seq {seq_id}: appending 1 token to {written + shift} exceeds its "
                                     f"final_len {r.final_len}; the sequence must end (free it) "
                                     "instead")
                r.written = written + 1
                done += 1
        finally:
            self._ledger.written += done
        return done

    def append_batch(self, seq_ids: Sequence[int], token_lists: Sequence[Sequence[int]],
                     copies: list[tuple[int, int]]) -> int:
        """``append(seq_id, tokens)`` for each pair in order, in one call. Never short of
        memory, so it returns ``len(seq_ids)``; no copies."""
        seqs, shift = self._seqs, self._shift
        done = written_sum = 0
        try:
            for seq_id, tokens in zip(seq_ids, token_lists):
                r = seqs.get(seq_id)
                k = len(tokens)
                if r is None or r.cpu_start is not None or r.written + shift + k > r.final_len:
                    self.append(seq_id, tokens)  # raises the right error
                r.written += k
                written_sum += k
                done += 1
        finally:
            self._ledger.written += written_sum
        return done

    def advance_all(self, count: int, num_seqs: int) -> bool:
        """Every sequence the manager holds appends ``count`` tokens, in O(1), when it holds
        exactly ``num_seqs``, none swapped out (a fast-forwarded span of decode steps);
        False (nothing changed) otherwise.

        NOTE: unchecked: the caller guarantees that none passes its ``final_len`` (a span
        ends with the step in which the first sequence finishes).
        """
        if self._num_swapped or len(self._seqs) != num_seqs:
            return False
        self._shift += count
        self._ledger.written += count * num_seqs
        return True

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[tuple[int, int]] | None:
        """Reserve an extent for ``child_id`` (policy applied to the parent's prompt length
        and ``final_len``) and return the slot copies ``[(parent_slot, child_slot)]`` of the
        parent's written slots; None (nothing changed) when no extent fits."""
        p = self._get_resident(parent_id, "fork")
        self._check_new(child_id, p.prompt_len, final_len)
        written = p.written + self._shift
        if final_len < written:
            raise ValueError(f"child final_len {final_len} < the {written} tokens it "
                             f"inherits from seq {parent_id}")
        c = self._place(p.prompt_len, final_len, written)
        if c is None:
            return None
        self._seqs[child_id] = c
        self.stats.fork_copies += written
        return [(p.start + i, c.start + i) for i in range(written)]

    def _release_device(self, r: _Res) -> None:
        self.arena.free(r.start)
        self._ledger.remove(r.written + self._shift, r.final_len, r.reservation, r.taken)
        r.start = None

    def free(self, seq_id: int) -> None:
        r = self._seqs.pop(seq_id, None)
        if r is None:
            self._get(seq_id)  # raises the right error
        if r.cpu_start is not None:
            self._cpu.free(r.cpu_start)
            self._num_swapped -= 1
        else:
            self._release_device(r)

    def swap_out(self, seq_id: int) -> list[tuple[int, int]] | None:
        """Move the written slots to CPU slots and free the extent: ``[(device, cpu)]``."""
        r = self._get_resident(seq_id, "swap out")
        written = r.written + self._shift
        cpu_start = self._cpu.allocate(written) if self._cpu is not None else None
        if cpu_start is None:
            return None
        mapping = [(r.start + i, cpu_start + i) for i in range(written)]
        self._release_device(r)
        r.cpu_start = cpu_start
        self._num_swapped += 1
        self.stats.swap_outs += 1
        self.stats.swapped_out_units += written
        return mapping

    def swap_in(self, seq_id: int) -> list[tuple[int, int]] | None:
        """Place the reservation again and copy the slots back: ``[(cpu, device)]``."""
        r = self._get(seq_id)
        if r.cpu_start is None:
            raise ValueError(f"seq {seq_id} is not swapped out; only swap_in after swap_out")
        start = self.arena.allocate(r.reservation)
        if start is None:
            return None
        cpu_start = r.cpu_start
        self._cpu.free(cpu_start)
        self._num_swapped -= 1
        r.start, r.cpu_start = start, None
        r.taken = self.arena.size_of(start)
        written = r.written + self._shift  # (no shift while it was out)
        self._ledger.add(written, r.final_len, r.reservation, r.taken)
        self.stats.swap_ins += 1
        self.stats.swapped_in_units += written
        return [(cpu_start + i, start + i) for i in range(written)]

    # ------------------------------------------------------------ accounting
    def breakdown(self, memory_blocked: bool) -> MemoryBreakdown:
        """O(1) (plus O(log capacity) for the buddy's largest free block).

        NOTE: ``make_breakdown``'s figures, built positionally (the engine asks once per
        step and once per fast-forward span)."""
        g = self._ledger
        written, taken, reservation, final = g.written, g.taken, g.reservation, g.final
        free = self.capacity_slots - taken
        return MemoryBreakdown(
            self.capacity_slots, written, final - written, reservation - final,
            taken - reservation, free if memory_blocked else 0, 0 if memory_blocked else free,
            written, taken, self.arena.largest_free_extent())
