"""Attention over the KV cache: the per-layer callbacks the model calls in an executor step.

``CacheAttention`` holds one executor's caches (per layer, paged ``[num_blocks, block_size,
kv_heads, head_dim]`` or contiguous ``[num_slots, kv_heads, head_dim]``) and builds, per
step, the ``attention(layer, q, k, v)`` callback of ``harness.engine.model``: write every
new token's K/V first (so each chunk's own keys, and a prefix block registered this step
by another sequence, are in the cache), then decode rows through the paged or contiguous
decode kernel and prefill rows through ``pagebench.kernels.paged_prefill.prefill_attention``, both
reading the cache in place through the step's index (block tables or start slots). On the
batch-invariant path both kinds of rows read their keys through the same index and run
``model.exact_attention`` (float64). ``for_graph`` is the decode-only callback a captured
CUDA graph runs over static buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.engine.model import AttentionFn, dense_causal_attention, exact_decode_attention
from pagebench.kernels.cache_write import write_kv_cache
from pagebench.kernels.contiguous_decode import contiguous_decode_attention
from pagebench.kernels.paged_decode import paged_decode_attention
from pagebench.kernels.paged_prefill import prefill_attention


@dataclass
class PrefillChunk:
    rows: tuple[int, int]  # [r0, r1) rows of the step's token arrays
    start: int  # position of the chunk's first token
    end: int  # position after its last token (the context it attends to)


@dataclass
class StepInputs:
    """One step's device inputs (uploaded in one copy by the executor)."""

    tokens: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    write_slots: torch.Tensor  # [W] int32, W = T + member rows (contiguous forks)
    write_rows: torch.Tensor | None  # [W] long rows of k/v to write, None = 0..T-1
    num_decode: int
    # every chunk's row (decode chunks, then prefill chunks) of the cache index:
    # paged: block tables [n, width]; contiguous: start slots [n]
    index: torch.Tensor
    decode_lens: torch.Tensor | None  # [num_decode] int32
    max_decode_len: int
    decode_lens_host: list[int]
    prefills: list[PrefillChunk]
    query_starts: torch.Tensor | None  # [num_prefill + 1] int32: prefill rows, from row num_decode
    prefill_lens: torch.Tensor | None  # [num_prefill] int32: each chunk's end
    sample_rows: torch.Tensor | None  # [S] long
    sample_seqs: list[tuple] = field(default_factory=list)  # per sample row: the sequences
    graph_bucket: int | None = None  # a decode step replaying this bucket's CUDA graph


class CacheAttention:
    """The attention callbacks over one executor's KV caches."""

    def __init__(self, model, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                 kv_flat: list[tuple[torch.Tensor, torch.Tensor]], *, paged: bool, block_size: int,
                 backend: str, batch_invariant: bool) -> None:
        self.model, self.k_caches, self.v_caches, self.kv_flat = model, k_caches, v_caches, kv_flat
        self.paged, self.block_size = paged, block_size
        self.backend, self.batch_invariant = backend, batch_invariant
        self.device = model.device

    def for_step(self, inputs: StepInputs) -> AttentionFn:
        """The per-layer attention of an eager step: KV writes, then decode and prefill rows."""
        model, backend, exact = self.model, self.backend, self.batch_invariant
        n_dec, window = inputs.num_decode, model.window
        # the float64 path reads every context slot through the index: [chunks, max_len]
        max_len = max([inputs.max_decode_len] + [p.end for p in inputs.prefills])
        slot_index = self.slot_index(inputs.index, max_len) if exact else None
        decode_index = inputs.index[:n_dec]
        prefill_index = inputs.index[n_dec:]
        max_query_len = max((p.rows[1] - p.rows[0] for p in inputs.prefills), default=0)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # q [T, num_heads, head_dim]; k, v [T, num_kv_heads, head_dim]
            k_cache, v_cache = self.k_caches[layer], self.v_caches[layer]
            if inputs.write_rows is not None:
                k_new, v_new = k.index_select(0, inputs.write_rows), v.index_select(0, inputs.write_rows)
            else:
                k_new, v_new = k, v
            # every new token's K/V first: the chunks below read their own keys from the cache
            write_kv_cache(k_new, v_new, k_cache, v_cache, inputs.write_slots, backend=backend)
            out = torch.empty_like(q)  # [T, num_heads, head_dim]
            if exact:  # float64 accumulation, the same function for decode and prefill rows
                flat_k, flat_v = self.kv_flat[layer]  # [num_slots, num_kv_heads, head_dim]
                if n_dec:
                    out[:n_dec] = exact_decode_attention(q[:n_dec], flat_k, flat_v, slot_index,
                                                         inputs.decode_lens_host, model.scale, window)
                for i, p in enumerate(inputs.prefills, start=n_dec):
                    slots = slot_index[i, :p.end]
                    r0, r1 = p.rows
                    out[r0:r1] = dense_causal_attention(
                        q[r0:r1], flat_k.index_select(0, slots), flat_v.index_select(0, slots),
                        p.start, batch_invariant=True, scale=model.scale, window=window)
                return out
            if n_dec:
                decode = paged_decode_attention if self.paged else contiguous_decode_attention
                decode(q[:n_dec], k_cache, v_cache, decode_index, inputs.decode_lens,
                       max_context_len=inputs.max_decode_len, scale=model.scale,
                       sliding_window=window, out=out[:n_dec], backend=backend)
            if inputs.prefills:
                prefill_attention(q[n_dec:], k_cache, v_cache, prefill_index, inputs.query_starts,
                                  inputs.prefill_lens, max_query_len=max_query_len, scale=model.scale,
                                  sliding_window=window, out=out[n_dec:], backend=backend)
            return out

        return attend

    def for_graph(self, index: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor,
                  max_context_len: int) -> AttentionFn:
        """The decode attention a captured graph runs: KV write, then the decode kernel."""
        model, backend, window = self.model, self.backend, self.model.window
        decode = paged_decode_attention if self.paged else contiguous_decode_attention

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_cache, v_cache = self.k_caches[layer], self.v_caches[layer]
            write_kv_cache(k, v, k_cache, v_cache, slots, backend=backend)
            return decode(q, k_cache, v_cache, index, lens, max_context_len=max_context_len,
                          scale=model.scale, sliding_window=window, backend=backend)

        return attend

    def slot_index(self, index: torch.Tensor, max_len: int) -> torch.Tensor:
        """[chunks, max_len] long: the slot of every context position, read through the
        block tables (paged) or the start offsets (contiguous); positions past a sequence's
        length point at a valid slot and are masked."""
        positions = torch.arange(max_len, device=self.device)  # [max_len]
        if self.paged:
            tables = index.long()  # [n, width]
            width = tables.shape[1]
            blocks = tables[:, (positions // self.block_size).clamp_(max=width - 1)]  # [n, max_len]
            return blocks * self.block_size + positions % self.block_size
        slots = index.long()[:, None] + positions[None, :]
        return slots.clamp_(max=self.kv_flat[0][0].shape[0] - 1)
