"""vAttention-style KV memory: a virtually contiguous range per request, physical pages
mapped on demand (Prabhu et al., "vAttention: Dynamic Memory Management for Serving LLMs
without PagedAttention", ASPLOS'25).

Each request reserves virtual address space for ``max_model_len`` tokens per layer, for
K and for V; physical memory is committed in pages of ``page_size`` bytes, each holding
``tokens_per_page = page_size / (kv_heads * head_dim * dtype bytes)`` tokens of one
layer's K (or V). Every layer's K and V grow in lockstep, so a request that holds ``n``
tokens has ``ceil(n / tokens_per_page)`` pages in each of its ``2 * layers`` buffers: the
manager hands out *page groups* (one page per buffer, ``2 * layers`` pages) of
``tokens_per_page`` slots, and counts pages as ``2 * layers`` per group. The pool is the
KV memory's bytes cut into pages; its capacity in slots is what those pages hold.

Accounting (docs/memory.md), per layer and K/V alike: token states are the written
tokens; the committed but unfilled part of a request's last page is reserved up to its
final length and internal fragmentation beyond it; free pages are idle or external
fragmentation like any free slot (any free page serves any request: physical memory has
no placement constraint). The virtual reservation is reported (``virtual_slots``,
``stats.peak_virtual_slots``) but is not KV memory.

Freed pages are unmapped (``stats.unmapped_pages``) or, with ``keep_mapped``, handed to
the next request still mapped (vAttention's deferred reclamation, as one pool of mapped
free pages); ``stats.mapped_pages`` counts the mappings the time model charges. Fork and
swap copy the written slots (no sharing between virtual ranges).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from pagebench.allocators.accounting import make_breakdown
from pagebench.allocators.base import (Admission, Capabilities, ManagerStats, MemoryBreakdown, append_in_order,
                             register_manager)

KIB = 1024
PAGE_SIZES = (64 * KIB, 128 * KIB, 256 * KIB, 2048 * KIB)  # the sizes vAttention supports

class _Request:
    __slots__ = ("groups", "num_tokens", "final_len", "cpu_slots")

    def __init__(self, groups: list[int], num_tokens: int, final_len: int) -> None:
        self.groups = groups  # physical page groups, in virtual order
        self.num_tokens = num_tokens
        self.final_len = final_len  # accounting only: what "reserved" fills up to
        self.cpu_slots: list[int] | None = None  # CPU slots while swapped out


@register_manager("vattention")
class VAttentionKVCacheManager:
    """Page groups of ``tokens_per_page`` slots over ``capacity_slots`` slots of KV memory."""

    tensor_layout = "none"  # virtually contiguous per sequence: no torch layout here
    uses_block_size = False
    options = ("page_size", "keep_mapped", "async_mapping", "map_page_s", "unmap_page_s")

    @classmethod
    def from_system(cls, system, capacity_slots: int, cpu_slots: int, max_model_len: int,
                    model) -> "VAttentionKVCacheManager":
        """The catalog entry ``kind: vattention`` (``page_size``, ``keep_mapped``)."""
        return cls(capacity_slots, system.option("page_size"), layer_token_bytes(model),
                   layers=model.layers, max_model_len=max_model_len, num_cpu_slots=cpu_slots,
                   keep_mapped=system.option("keep_mapped"), name=system.name)

    @staticmethod
    def system_problem(system, model) -> tuple[str, str] | None:
        page_size = system.option("page_size")
        if isinstance(page_size, bool) or page_size not in PAGE_SIZES:
            return "page_size", (f"must be one of {', '.join(map(str, PAGE_SIZES))} bytes (64 KiB, "
                                 f"128 KiB, 256 KiB or 2 MiB, as vAttention supports), got "
                                 f"{page_size!r}")
        for key in ("keep_mapped", "async_mapping"):
            if not isinstance(system.option(key), bool):
                return key, f"must be true or false, got {system.option(key)!r}"
        for key in ("map_page_s", "unmap_page_s"):
            value = system.option(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                return key, f"must be a number of seconds >= 0, got {value!r}"
        if model is not None and tokens_per_page(page_size, model) < 1:
            return "page_size", (f"{page_size} bytes is smaller than one token of one layer of "
                                 f"{model.name} ({layer_token_bytes(model)} bytes)")
        return None

    @staticmethod
    def label(system) -> str:
        return f"vattention ({system.option('page_size') // KIB} KiB pages)"

    @staticmethod
    def kernel_layout(system, model) -> tuple[str, int | None]:
        """The decode kernel's layout the cost model prices: vAttention keeps KV virtually contiguous, read by unmodified contiguous kernels."""
        return "contiguous", None

    def __init__(self, capacity_slots: int, page_size: int, layer_token_bytes: int, *,
                 layers: int, max_model_len: int, num_cpu_slots: int = 0,
                 keep_mapped: bool = False, name: str = "vattention") -> None:
        tokens_per_page = page_size // layer_token_bytes
        if tokens_per_page < 1:
            raise ValueError(f"a page of {page_size} bytes holds no token of one layer "
                             f"({layer_token_bytes} bytes): use a larger page_size")
        # NOTE: the pool's bytes in pages; a page's bytes beyond its last whole token (when
        # page_size is not a multiple of a token) are not KV slots, so the capacity in
        # slots is what the pages hold (at most capacity_slots)
        num_groups = capacity_slots * layer_token_bytes // page_size
        if num_groups < 1:
            raise ValueError(f"a KV pool of {capacity_slots} slots holds no page of "
                             f"{page_size} bytes per layer: raise the capacity or lower page_size")
        self.name = name
        self.page_size = page_size
        self.tokens_per_page = tokens_per_page
        self.pages_per_group = 2 * layers  # one page per layer, for K and for V
        self.num_groups = num_groups
        self.capacity_slots = num_groups * tokens_per_page
        self.max_model_len = max_model_len
        self.num_cpu_slots = num_cpu_slots
        self.keep_mapped = keep_mapped
        self.stats = ManagerStats()
        self.capabilities = Capabilities(layout=self.tensor_layout, batched_decode=True, maps_pages=True)
        self._unmapped = list(range(num_groups - 1, -1, -1))  # pop() -> lowest group id
        self._mapped: list[int] = []  # free groups still mapped (keep_mapped)
        self._cpu_free = list(range(num_cpu_slots - 1, -1, -1))
        self._reqs: dict[int, _Request] = {}
        self._written = 0  # tokens written by device-resident requests
        self._allocated = 0  # groups held by device-resident requests
        self._to_fill = 0  # sum over them of min(final_len, committed slots)

    # ---------------------------------------------------------------- queries
    @property
    def num_free_groups(self) -> int:
        return len(self._unmapped) + len(self._mapped)

    @property
    def virtual_slots(self) -> int:
        """Virtual address space reserved now, in token slots (not KV memory)."""
        return len(self._reqs) * self.max_model_len

    def page_groups(self, seq_id: int) -> list[int]:
        return list(self._get(seq_id).groups)

    def _get(self, seq_id: int) -> _Request:
        if seq_id not in self._reqs:
            raise ValueError(f"unknown seq_id {seq_id!r}: admit it (or fork into it) first")
        return self._reqs[seq_id]

    def _groups_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.tokens_per_page)

    def fits_empty_pool(self, prompt_len: int, final_len: int) -> bool:
        return self._groups_for(final_len) <= self.num_groups

    def member_slots(self, prompt_len: int, final_len: int) -> int:
        return self._groups_for(final_len) * self.tokens_per_page

    def cached_prefix_tokens(self, prompt_token_ids: Sequence[int]) -> int:
        return 0

    def slot_mapping(self, seq_id: int, start: int, end: int) -> list[int]:
        r = self._get(seq_id)
        if r.cpu_slots is not None or not 0 <= start <= end <= r.num_tokens:
            raise ValueError(f"slot range [{start}, {end}) is not resident in seq {seq_id}")
        t, groups = self.tokens_per_page, r.groups
        return [groups[p // t] * t + p % t for p in range(start, end)]

    # ------------------------------------------------------------- life cycle
    def _take(self, n: int) -> list[int] | None:
        """``n`` free groups, mapped ones first (no new mapping); None when short."""
        if n > self.num_free_groups:
            return None
        kept = [self._mapped.pop() for _ in range(min(n, len(self._mapped)))]
        fresh = [self._unmapped.pop() for _ in range(n - len(kept))]
        self.stats.mapped_pages += len(fresh) * self.pages_per_group
        return kept + fresh

    def _give_back(self, groups: list[int]) -> None:
        if self.keep_mapped:
            self._mapped.extend(reversed(groups))
        else:
            self._unmapped.extend(reversed(groups))
            self._unmapped.sort(reverse=True)  # NOTE: lowest id first, whatever the free order
            self.stats.unmapped_pages += len(groups) * self.pages_per_group

    def _account(self, r: _Request, sign: int) -> None:
        committed = len(r.groups) * self.tokens_per_page
        self._written += sign * r.num_tokens
        self._allocated += sign * len(r.groups)
        self._to_fill += sign * min(r.final_len, committed)

    def can_admit(self, prompt_token_ids: Sequence[int], final_len: int, num_tokens: int) -> bool:
        return self._groups_for(num_tokens) <= self.num_free_groups

    def admit(self, seq_id: int, prompt_token_ids: Sequence[int], final_len: int,
              num_tokens: int) -> Admission | None:
        if seq_id in self._reqs:
            raise ValueError(f"seq_id {seq_id!r} is already admitted: free it first or use a new id")
        if not 1 <= num_tokens <= len(prompt_token_ids) <= final_len:
            raise ValueError(f"seq {seq_id}: need 1 <= num_tokens {num_tokens} <= prompt length "
                             f"{len(prompt_token_ids)} <= final_len {final_len}")
        groups = self._take(self._groups_for(num_tokens))
        if groups is None:
            return None
        r = self._reqs[seq_id] = _Request(groups, num_tokens, final_len)
        self._account(r, +1)
        self.stats.peak_virtual_slots = max(self.stats.peak_virtual_slots, self.virtual_slots)
        return Admission(num_cached_tokens=0)

    def append(self, seq_id: int, token_ids: Sequence[int]) -> list[tuple[int, int]] | None:
        r = self._get(seq_id)
        if r.cpu_slots is not None:
            raise ValueError(f"cannot append to seq {seq_id}: it is swapped out; swap_in it first")
        new_n = r.num_tokens + len(token_ids)
        if new_n > r.final_len:
            raise ValueError(f"seq {seq_id}: appending {len(token_ids)} tokens to {r.num_tokens} "
                             f"exceeds its final_len {r.final_len}")
        more = self._take(max(0, self._groups_for(new_n) - len(r.groups)))
        if more is None:
            return None
        self._account(r, -1)
        r.groups += more
        r.num_tokens = new_n
        self._account(r, +1)
        return []

    def append_decode(self, seq_ids: Sequence[int], token_ids: Iterable[int],
                      copies: list[tuple[int, int]]) -> int:
        return append_in_order(self.append, seq_ids, [(token,) for token in token_ids], copies)

    def append_batch(self, seq_ids: Sequence[int], token_lists: Sequence[Sequence[int]],
                     copies: list[tuple[int, int]]) -> int:
        return append_in_order(self.append, seq_ids, token_lists, copies)

    def fork(self, parent_id: int, child_id: int, final_len: int) -> list[tuple[int, int]] | None:
        """The child gets its own pages and a copy of every written slot: ``[(src, dst)]``."""
        p = self._get(parent_id)
        if p.cpu_slots is not None:
            raise ValueError(f"cannot fork seq {parent_id}: it is swapped out; swap_in it first")
        if child_id in self._reqs:
            raise ValueError(f"child seq_id {child_id!r} already exists: fork into a new id")
        if final_len < p.num_tokens:
            raise ValueError(f"child final_len {final_len} < the {p.num_tokens} tokens it inherits")
        groups = self._take(len(p.groups))
        if groups is None:
            return None
        c = self._reqs[child_id] = _Request(groups, p.num_tokens, final_len)
        self._account(c, +1)
        self.stats.fork_copies += p.num_tokens
        self.stats.peak_virtual_slots = max(self.stats.peak_virtual_slots, self.virtual_slots)
        return list(zip(self.slot_mapping(parent_id, 0, p.num_tokens),
                        self.slot_mapping(child_id, 0, c.num_tokens)))

    def free(self, seq_id: int) -> None:
        r = self._get(seq_id)
        del self._reqs[seq_id]
        if r.cpu_slots is not None:
            self._cpu_free.extend(reversed(r.cpu_slots))
            return
        self._account(r, -1)
        self._give_back(r.groups)

    def swap_out(self, seq_id: int) -> list[tuple[int, int]] | None:
        """Copy the written slots to CPU slots and give the pages back: ``[(device, cpu)]``."""
        r = self._get(seq_id)
        if r.cpu_slots is not None:
            raise ValueError(f"seq {seq_id} is swapped out already")
        if r.num_tokens > len(self._cpu_free):
            return None
        mapping = list(zip(self.slot_mapping(seq_id, 0, r.num_tokens),
                           [self._cpu_free.pop() for _ in range(r.num_tokens)]))
        self._account(r, -1)
        self._give_back(r.groups)
        r.groups, r.cpu_slots = [], [cpu for _, cpu in mapping]
        self.stats.swap_outs += 1
        self.stats.swapped_out_units += r.num_tokens
        return mapping

    def swap_in(self, seq_id: int) -> list[tuple[int, int]] | None:
        r = self._get(seq_id)
        if r.cpu_slots is None:
            raise ValueError(f"seq {seq_id} is not swapped out; only swap_in after swap_out")
        groups = self._take(self._groups_for(r.num_tokens))
        if groups is None:
            return None
        cpu, r.groups, r.cpu_slots = r.cpu_slots, groups, None
        self._cpu_free.extend(reversed(cpu))
        self._account(r, +1)
        self.stats.swap_ins += 1
        self.stats.swapped_in_units += len(cpu)
        return list(zip(cpu, self.slot_mapping(seq_id, 0, r.num_tokens)))

    # ------------------------------------------------------------- accounting
    def breakdown(self, memory_blocked: bool) -> MemoryBreakdown:
        """O(1): from the running sums; a committed page's unfilled tail is reserved up to
        the final length and internal fragmentation beyond it."""
        allocated = self._allocated * self.tokens_per_page
        free = self.capacity_slots - allocated
        return make_breakdown(
            capacity_slots=self.capacity_slots, allocated_slots=allocated,
            token_states=self._written, reserved=self._to_fill - self._written,
            internal_over_reservation=0, internal_rounding=allocated - self._to_fill,
            memory_blocked=memory_blocked, logical_tokens=self._written,
            largest_free_extent=free, cached_free_slots=0,
        )


def layer_token_bytes(model) -> int:
    """Bytes of one token of one layer's K (or V): kv_heads * head_dim * dtype bytes."""
    return model.bytes_per_slot // (2 * model.layers)


def tokens_per_page(page_size: int, model) -> int:
    """Tokens of one layer's K (or V) that a ``page_size``-byte page holds."""
    return page_size // layer_token_bytes(model)
