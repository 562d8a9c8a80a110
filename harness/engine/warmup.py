"""The torch executor's start-up: every kernel shape a run will launch, run once before
the first timed step, as vLLM's engine start-up does (its profile run, then CUDA graph
capture), so that no timed step pays for a compilation, an autotuning or a lazy load.

What a step launches, and what the warm-up runs for it:

- the linear layers (cuBLAS picks a kernel per row count; lazily loaded on first use):
  a forward pass at every power of four tokens up to ``max_num_batched_tokens`` and at it
  (``token_counts``), attention skipped (the layers' GEMMs only), the LM head at the
  sampled-row counts;
- the KV write, block copies, and the prefill and decode attention kernels. Triton
  compiles a kernel once per specialization of its integer arguments (a value of 1, a
  multiple of 16, or any other) and the decode kernel compiles once per split-K mode (one
  fixed config per shape, no autotuning: kernels/decode_plan.py); the one such argument
  that changes between steps is the block-table row stride (the step's
  widest table), so each kernel runs at a table width of each class (``index_widths``:
  1, 16 and 17 blocks, within ``max_model_len``) and, for decode, with and without split-K;
- sampling (argmax over the vocabulary).

CUDA graphs of the decode buckets are captured after it (``cuda_graphs.DecodeGraphs``).
On CPU the same calls run the torch reference paths (nothing to compile; it is cheap and
keeps one code path). The executor reports the figures (results.json ``executor.warmup``)
and prints how long it took.
"""

from __future__ import annotations

import time

import torch

from pagebench.kernels.cache_write import copy_blocks, write_kv_cache
from pagebench.kernels.contiguous_decode import contiguous_decode_attention
from pagebench.kernels.paged_decode import paged_decode_attention
from pagebench.kernels.paged_prefill import prefill_attention


def token_counts(max_num_batched_tokens: int) -> list[int]:
    """1, 4, 16, ... below ``max_num_batched_tokens``, then it."""
    counts, n = [], 1
    while n < max_num_batched_tokens:
        counts.append(n)
        n *= 4
    return counts + [max_num_batched_tokens]


def index_widths(max_blocks: int) -> list[int]:
    """Block-table widths, one per Triton specialization class of the row stride (1, a
    multiple of 16, another), at most ``max_blocks``."""
    return sorted({min(w, max_blocks) for w in (1, 16, 17)})


def _skip_attention(_layer: int, q: torch.Tensor, _k: torch.Tensor, _v: torch.Tensor) -> torch.Tensor:
    return q  # [T, num_heads, head_dim]: the GEMMs' shapes without attention's memory


def warm_up(executor, engine, max_model_len: int) -> dict:
    """Run every kernel shape of ``executor``'s steps once (module docstring); its figures."""
    model, device = executor.model, executor.device
    started = time.perf_counter()
    counts = token_counts(engine.max_num_batched_tokens)
    with torch.inference_mode():
        for n in counts:
            tokens = torch.zeros(n, dtype=torch.long, device=device)
            positions = torch.arange(n, device=device) % executor.spec.max_context
            hidden = model.forward(tokens, positions, _skip_attention)  # [n, hidden]
            rows = min(n, engine.max_num_seqs)
            model.logits(hidden[-rows:]).argmax(dim=-1)
        linear_s = time.perf_counter() - started
        widths = _warm_kernels(executor, max_model_len)
    if executor.cuda:
        torch.cuda.synchronize(device)
    return {"token_counts": counts, "linear_s": round(linear_s, 3), "index_widths": widths,
            "kernels_s": round(time.perf_counter() - started - linear_s, 3)}


def _warm_kernels(executor, max_model_len: int) -> list[int]:
    """The KV write, copies, prefill and decode attention at each table-width class."""
    model, device, backend = executor.model, executor.device, executor.backend
    k_cache, v_cache = executor.k_caches[0], executor.v_caches[0]
    kv_heads, head_dim = executor.spec.num_kv_heads, executor.spec.head_dim
    i32 = dict(dtype=torch.int32, device=device)
    new = torch.zeros(1, kv_heads, head_dim, dtype=model.dtype, device=device)
    write_kv_cache(new, new, k_cache, v_cache, torch.zeros(1, **i32), backend=backend)
    if k_cache.shape[0] > 1:  # blocks (paged) or slots (contiguous forks)
        copy_blocks([k_cache], [(0, 1)], backend=backend)
    unit = executor.block_size if executor.paged else 1
    max_blocks = -(-max_model_len // unit) if executor.paged else 1
    widths = index_widths(max_blocks) if executor.paged else [1]
    for width in widths:
        length = min(width * unit if executor.paged else 8, max_model_len)
        index = (torch.zeros((2, width), **i32) if executor.paged else torch.zeros(2, **i32))
        rows = min(length, 8)
        q = torch.zeros(2 * rows, model.num_heads, head_dim, dtype=model.dtype, device=device)
        starts = torch.tensor([0, rows, 2 * rows], **i32)
        ends = torch.full((2,), length, **i32)
        prefill_attention(q, k_cache, v_cache, index, starts, ends, max_query_len=rows,
                          sliding_window=model.window, backend=backend)
        q = torch.zeros(2, model.num_heads, head_dim, dtype=model.dtype, device=device)
        for splits in (1, 2):  # the decode kernel's SPLIT modes (each its own compiled variant on CUDA)
            if executor.paged:
                paged_decode_attention(q, k_cache, v_cache, index, ends, max_context_len=length,
                                       num_splits=splits, sliding_window=model.window, backend=backend)
            else:
                contiguous_decode_attention(q, k_cache, v_cache, index, ends, max_context_len=length,
                                            num_splits=splits, sliding_window=model.window,
                                            backend=backend)
    return widths


def warmup_summary(figures: dict) -> str:
    """One console line of what the warm-up ran."""
    parts = [f"GEMMs at {len(figures['token_counts'])} token counts up to {figures['token_counts'][-1]}",
             f"attention kernels at table widths {figures['index_widths']}"]
    if figures.get("cuda_graphs"):
        parts.append(f"{figures['cuda_graphs']} CUDA graphs captured in {figures['graph_capture_s']:.2f} s")
    return ", ".join(parts)
