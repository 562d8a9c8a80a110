"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket (``engine.cuda_graphs``).

A decode step launches the same kernels every time (per layer: projections, rotary, the KV
write, the decode kernel, the MLP), so its host cost -- Python, checks, launches -- can be
paid once: ``DecodeGraphs`` captures the whole decode forward plus the LM head for each
bucket of ``capture_sizes`` (1, 2, 4, then multiples of 8 up to ``max_num_seqs``, vLLM's
default capture sizes) over static input buffers, and a step of ``n`` sequences replays the
smallest bucket ``>= n`` after copying its inputs into those buffers:

- tokens, positions, slot mapping and context lengths: the step's ``n`` rows, then padding
  rows (``pad_decode_arrays``: token 0 at position 0, slot -1 so the KV write skips it,
  context length 0 so the decode kernel reads nothing and writes zeros);
- block tables (paged) or start slots (contiguous): a static ``[max bucket, max_blocks]``
  buffer whose first ``n`` rows and ``width`` columns are the step's; padding rows are
  never read (length 0), nor columns past a row's ``ceil(len / block_size)``.

The decode kernels are captured with ``max_context_len = max_model_len`` (their launch
grid must not change between replays). Graphs are captured at start-up, after the
kernels are compiled, so no timed step pays for a capture. Steps with a prefill chunk, a
batch above the largest bucket or extra KV writes (contiguous forks) run eagerly, and the
executor's report says how many steps took each path.
"""

from __future__ import annotations

import numpy as np
import torch

# what a padding row holds, per array name of the step's upload
PAD_VALUES = {"tokens": 0, "positions": 0, "write_slots": -1, "decode_lens": 0}


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, 8, 16, 24, ... up to max_num_seqs (included)."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return sizes + [max_num_seqs]


def bucket_for(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds ``num_seqs`` rows, or None (run eagerly)."""
    return next((s for s in sizes if s >= num_seqs), None) if num_seqs > 0 else None


def pad_decode_arrays(arrays: dict[str, np.ndarray], num_seqs: int, bucket: int) -> dict[str, np.ndarray]:
    """The step's per-row arrays (``PAD_VALUES``' names) padded from ``num_seqs`` to ``bucket``
    rows with harmless rows; other arrays are returned unchanged."""
    out = dict(arrays)
    for name, pad in PAD_VALUES.items():
        values = arrays[name]
        if values.shape[0] != num_seqs:
            raise ValueError(f"{name} has {values.shape[0]} rows, the step has {num_seqs}")
        out[name] = np.concatenate([values, np.full(bucket - num_seqs, pad, dtype=values.dtype)])
    return out


class DecodeGraphs:
    """One captured decode forward (+ LM head) per bucket over shared static buffers.

    ``attention_fn(index, lens, slots, max_context_len)`` builds the per-layer attention
    callback the model calls (the executor's decode path: KV write, then the decode
    kernel), reading the static buffers given.
    """

    def __init__(self, model, *, sizes: list[int], index_shape: tuple[int, ...],
                 max_context_len: int, attention_fn) -> None:
        device = model.device
        self.model, self.sizes = model, sizes
        top = sizes[-1]
        self.tokens = torch.zeros(top, dtype=torch.long, device=device)
        self.positions = torch.zeros(top, dtype=torch.long, device=device)
        self.slots = torch.full((top,), -1, dtype=torch.int32, device=device)
        self.lens = torch.zeros(top, dtype=torch.int32, device=device)
        self.index = torch.zeros((top, *index_shape), dtype=torch.int32, device=device)
        self.max_context_len = max_context_len
        # every graph writes its logits here: one [max bucket, vocab] buffer, not one per graph
        self.logits = torch.empty((top, model.vocab_size), dtype=torch.float32, device=device)
        self.attention_fn = attention_fn
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        pool = None
        for size in reversed(sizes):  # largest first: the smaller ones reuse its memory pool
            self.graphs[size] = self._capture(size, pool)
            pool = self.graphs[size].pool()

    def _forward(self, size: int) -> None:
        """The decode forward of the first ``size`` static rows; logits into ``self.logits``."""
        attend = self.attention_fn(self.index[:size], self.lens[:size], self.slots[:size],
                                   self.max_context_len)
        hidden = self.model.forward(self.tokens[:size], self.positions[:size], attend)
        self.logits[:size].copy_(self.model.logits(hidden))  # [size, vocab] float32

    def _capture(self, size: int, pool) -> torch.cuda.CUDAGraph:
        stream = torch.cuda.Stream(self.model.device)
        stream.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            self._forward(size)  # eager once: allocator and cuBLAS workspaces settle
        torch.cuda.current_stream(self.model.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=pool):
            self._forward(size)
        return graph

    def fits(self, num_seqs: int, table_width: int) -> int | None:
        """The bucket a decode step of ``num_seqs`` rows (block tables ``table_width`` wide;
        0 for start slots) replays, or None (run it eagerly)."""
        if self.index.dim() == 2 and table_width > self.index.shape[1]:
            return None
        return bucket_for(num_seqs, self.sizes)

    def replay(self, bucket: int, num_seqs: int, tokens: torch.Tensor, positions: torch.Tensor,
               slots: torch.Tensor, lens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Logits [num_seqs, vocab] of a decode step: tokens, positions, slots and lens are its
        arrays padded to ``bucket`` rows (``pad_decode_arrays``); index holds its ``num_seqs``
        rows ([num_seqs, width] block tables or [num_seqs] start slots)."""
        self.tokens[:bucket].copy_(tokens)
        self.positions[:bucket].copy_(positions)
        self.slots[:bucket].copy_(slots)
        self.lens[:bucket].copy_(lens)
        if index.dim() == 2:
            self.index[:num_seqs, :index.shape[1]].copy_(index)
        else:
            self.index[:num_seqs].copy_(index)
        self.graphs[bucket].replay()
        return self.logits[:num_seqs]
