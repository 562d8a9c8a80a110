"""The benchmark's inputs: one batch of K/V in both layouts, and the baselines' calls.

``make_contiguous_inputs`` draws K/V once; ``make_paged_layout`` cuts the same K/V into
blocks placed at random (as after allocator churn) or in order, so paged and contiguous
kernels read the same logical cache. ``sdpa_call`` / ``flex_call`` / ``linear_call`` build
the callables the benchmark times.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagebench.kernels.bench_spec import HeadConfig


@dataclass
class DecodeInputs:
    """One batch of equal-length sequences in both layouts (the same logical K/V)."""

    q: torch.Tensor  # [batch, heads, head_dim]
    k_contig: torch.Tensor  # [batch * context, kv_heads, head_dim]
    v_contig: torch.Tensor
    seq_starts: torch.Tensor  # [batch]
    context_lens: torch.Tensor  # [batch]


def make_contiguous_inputs(head: HeadConfig, batch: int, context: int, dtype: torch.dtype,
                           device: torch.device, gen: torch.Generator) -> DecodeInputs:
    shape = (batch * context, head.num_kv_heads, head.head_dim)
    k = torch.empty(shape, dtype=dtype, device=device).normal_(generator=gen)
    v = torch.empty(shape, dtype=dtype, device=device).normal_(generator=gen)
    q = torch.empty(batch, head.num_heads, head.head_dim, dtype=dtype, device=device).normal_(generator=gen)
    starts = torch.arange(batch, dtype=torch.int32, device=device) * context
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return DecodeInputs(q, k, v, starts, lens)


def make_paged_layout(inputs: DecodeInputs, block_size: int, order: str, gen: torch.Generator):
    """The same K/V cut into blocks placed at random (or in order); returns (k, v, tables)."""
    batch, context = inputs.q.shape[0], int(inputs.context_lens[0])
    per_seq = -(-context // block_size)
    num_blocks = batch * per_seq
    device = inputs.q.device
    perm = (torch.randperm(num_blocks, generator=gen) if order == "random" else torch.arange(num_blocks))
    perm = perm.to(device)
    tables = perm.view(batch, per_seq).to(torch.int32)
    kv_heads, head_dim = inputs.k_contig.shape[1:]

    def scatter(contig: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros(batch, per_seq * block_size, kv_heads, head_dim, dtype=contig.dtype, device=device)
        padded[:, :context] = contig.view(batch, context, kv_heads, head_dim)
        paged = torch.empty(num_blocks, block_size, kv_heads, head_dim, dtype=contig.dtype, device=device)
        paged[perm] = padded.view(num_blocks, block_size, kv_heads, head_dim)
        return paged

    return scatter(inputs.k_contig), scatter(inputs.v_contig), tables


# SDPA's CUDA backends, each timed on its own (torch.nn.attention.SDPBackend names)
SDPA_BACKENDS = ("cudnn", "flash", "efficient")


def sdpa_call(inputs: DecodeInputs, head: HeadConfig, backend: str | None = None):
    """SDPA over the contiguous cache; ``backend`` forces one of ``SDPA_BACKENDS`` (None: torch's
    dispatch). A backend that cannot run the shape (e.g. memory-efficient attention with
    ``enable_gqa``) raises when called: the benchmark records it as unsupported."""
    batch = inputs.q.shape[0]
    context = inputs.k_contig.shape[0] // batch
    q = inputs.q.unsqueeze(2)  # [batch, heads, 1, head_dim]
    k = inputs.k_contig.view(batch, context, head.num_kv_heads, head.head_dim).transpose(1, 2)
    v = inputs.v_contig.view(batch, context, head.num_kv_heads, head.head_dim).transpose(1, 2)
    gqa = head.num_heads != head.num_kv_heads
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if backend is None:
        return lambda: sdpa(q, k, v, enable_gqa=gqa)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def run():
        with sdpa_kernel(which):
            return sdpa(q, k, v, enable_gqa=gqa)

    return run


_FLEX_COMPILED = None


def flex_call(inputs: DecodeInputs, head: HeadConfig, k_paged, v_paged, tables, block_size: int,
              compiled: bool = True):
    """flex_attention over the paged cache: logical block mask converted through the table;
    GQA through ``enable_gqa`` (query head h reads KV head h // group). ``compiled=False``
    runs it eagerly (tests on CPU)."""
    global _FLEX_COMPILED
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if compiled and _FLEX_COMPILED is None:
        import torch._dynamo as dynamo  # NOTE: a bare `import torch._dynamo` would make `torch` local here

        for limit in ("recompile_limit", "cache_size_limit"):  # one compile per swept shape
            if hasattr(dynamo.config, limit):
                setattr(dynamo.config, limit, max(getattr(dynamo.config, limit), 64))
        _FLEX_COMPILED = torch.compile(flex_attention)
    attend = _FLEX_COMPILED if compiled else flex_attention
    batch, context = inputs.q.shape[0], int(inputs.context_lens[0])
    device = inputs.q.device
    num_blocks = k_paged.shape[0]
    paged = PagedAttention(num_blocks, block_size, batch, device=device)
    table = torch.full((batch, num_blocks), -1, dtype=torch.int64, device=device)
    table[:, :tables.shape[1]] = tables.long()
    to_logical = torch.full((batch, num_blocks), -1, dtype=torch.int64, device=device)
    rows = torch.arange(batch, device=device)[:, None].expand_as(tables)
    to_logical[rows, tables.long()] = torch.arange(tables.shape[1], device=device).expand_as(tables)
    paged.page_table, paged.physical_to_logical = table, to_logical  # our (scattered) tables
    logical = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx >= 0, batch, None, 1, context,
                                device=device, BLOCK_SIZE=(128, block_size))
    mask = paged.convert_logical_block_mask(logical, kv_len=inputs.context_lens.long())
    kv_heads, head_dim = k_paged.shape[2:]
    k = k_paged.view(-1, kv_heads, head_dim).transpose(0, 1).unsqueeze(0)  # [1, kv_heads, slots, D]
    v = v_paged.view(-1, kv_heads, head_dim).transpose(0, 1).unsqueeze(0)
    q = inputs.q.unsqueeze(2)
    gqa = head.num_heads != head.num_kv_heads
    return lambda: attend(q, k, v, block_mask=mask, enable_gqa=gqa)


def linear_call(head: HeadConfig, batch: int, dtype: torch.dtype, device: torch.device, gen):
    weights = [torch.empty(i, o, dtype=dtype, device=device).normal_(generator=gen) * 0.02
               for i, o in head.linear_shapes()]
    x = torch.empty(batch, max(i for i, _ in head.linear_shapes()), dtype=dtype, device=device).normal_(generator=gen)

    def run():
        for w in weights:
            torch.matmul(x[:, :w.shape[0]], w)

    nbytes = sum(w.numel() * w.element_size() for w in weights)
    return run, nbytes
