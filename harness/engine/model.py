"""A Llama-style decoder with seeded random weights (no downloads), for the torch executor.

RMSNorm -> fused QKV projection -> rotary embeddings -> attention (grouped-query) ->
output projection -> RMSNorm -> SwiGLU MLP (or a GELU MLP for ``mlp: gelu`` models),
residual connections, a final RMSNorm and the LM head. Dimensions come from a
``ModelSpec`` (``conf/model``); ``num_layers_override`` shortens the stack.

The model never sees the KV cache: ``forward`` takes an ``attention(layer, q, k, v)``
callback, and the executor decides where keys and values live (paged blocks or a
contiguous arena) and which kernel reads them. ``dense_causal_attention`` is the
no-cache attention of the same math, used for prefills and by the tests' full-recompute
reference.

Batch invariance (``batch_invariant=True``): every reduction (matmuls, norms, softmax)
accumulates in float64 and its result is rounded to the model dtype. A rounded float64
result is, except with negligible probability, the correctly rounded value, so a token's
activations do not depend on how many other tokens share its matmul, on chunking, or on
whether its attention ran in the prefill or the decode path. That is what lets the paged
system and the contiguous oracle generate identical tokens in fp32 on CPU even though
they batch different requests together. Off, the model runs the usual fast kernels.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from harness.config import ModelSpec

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
ROPE_THETA = 10_000.0
NORM_EPS = 1e-5
EXACT_QUERY_BLOCK = 256  # query rows per block of the float64 prefill attention

# attention(layer, q [T, num_heads, head_dim], k [T, num_kv_heads, head_dim], v) -> [T, num_heads, head_dim]
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class _Layer:
    __slots__ = ("attn_norm", "wqkv", "wo", "mlp_norm", "w_in", "w_down")

    def __init__(self, attn_norm, wqkv, wo, mlp_norm, w_in, w_down) -> None:
        self.attn_norm = attn_norm  # [hidden]
        self.wqkv = wqkv  # [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
        self.wo = wo  # [hidden, num_heads * head_dim]
        self.mlp_norm = mlp_norm  # [hidden]
        self.w_in = w_in  # gated: [2 * intermediate, hidden] (gate; up), gelu: [intermediate, hidden]
        self.w_down = w_down  # [hidden, intermediate]


class LlamaModel:
    """Seeded random weights of ``spec``'s dimensions on ``device`` in ``spec.dtype``."""

    def __init__(self, spec: ModelSpec, *, device: str | torch.device = "cpu", seed: int = 0,
                 batch_invariant: bool = False) -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = TORCH_DTYPES[spec.dtype]
        self.batch_invariant = bool(batch_invariant)
        self.num_layers = spec.layers
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.vocab_size = spec.vocab_size
        self.scale = 1.0 / math.sqrt(spec.head_dim)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        hidden, inter = spec.hidden_size, spec.intermediate_size
        qkv_out = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
        self.embed = self._randn(gen, (spec.vocab_size, hidden), 1.0)  # [vocab, hidden]
        self.layers: list[_Layer] = []
        for _ in range(self.num_layers):
            w_in_rows = 2 * inter if spec.mlp == "gated" else inter
            self.layers.append(_Layer(
                attn_norm=self._ones(hidden),
                wqkv=self._randn(gen, (qkv_out, hidden), hidden ** -0.5),
                wo=self._randn(gen, (hidden, spec.num_heads * spec.head_dim),
                               (spec.num_heads * spec.head_dim) ** -0.5),
                mlp_norm=self._ones(hidden),
                w_in=self._randn(gen, (w_in_rows, hidden), hidden ** -0.5),
                w_down=self._randn(gen, (hidden, inter), inter ** -0.5),
            ))
        self.final_norm = self._ones(hidden)
        self.lm_head = (self.embed if spec.tied_embeddings
                        else self._randn(gen, (spec.vocab_size, hidden), hidden ** -0.5))  # [vocab, hidden]
        # Rotary tables [max_context, head_dim / 2], computed in float64 once: a gather by
        # position is exact, so rotary embeddings are batch invariant in every mode.
        half = spec.head_dim // 2
        inv_freq = ROPE_THETA ** (-torch.arange(half, dtype=torch.float64) * 2.0 / spec.head_dim)
        angles = torch.outer(torch.arange(spec.max_context, dtype=torch.float64), inv_freq)
        table_dtype = torch.float64 if self.batch_invariant else torch.float32
        self.rope_cos = angles.cos().to(device=self.device, dtype=table_dtype)
        self.rope_sin = angles.sin().to(device=self.device, dtype=table_dtype)
        self._wide: dict[int, torch.Tensor] = {}  # float64 copies of weights (batch_invariant)

    # ------------------------------------------------------------------ weights
    def _randn(self, gen: torch.Generator, shape: tuple[int, int], std: float) -> torch.Tensor:
        """N(0, std^2) weights [rows, cols], drawn in float32 slabs of <= 256 MiB."""
        out = torch.empty(shape, dtype=self.dtype, device=self.device)
        rows = max(1, (1 << 26) // shape[1])
        for start in range(0, shape[0], rows):
            count = min(rows, shape[0] - start)
            slab = torch.empty((count, shape[1]), dtype=torch.float32, device=self.device)
            out[start:start + count] = slab.normal_(0.0, std, generator=gen)
        return out

    def _ones(self, n: int) -> torch.Tensor:
        return torch.ones(n, dtype=self.dtype, device=self.device)

    @property
    def weight_bytes(self) -> int:
        tensors = [self.embed, self.final_norm, *(getattr(layer, n) for layer in self.layers
                                                  for n in _Layer.__slots__)]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        return sum(t.numel() * t.element_size() for t in tensors)

    # ------------------------------------------------------------------ ops
    def _wide_weight(self, w: torch.Tensor) -> torch.Tensor:
        key = id(w)
        wide = self._wide.get(key)
        if wide is None:
            wide = self._wide[key] = w.to(torch.float64)
        return wide

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``x @ w.T``: x [T, in], w [out, in] -> [T, out] in the model dtype."""
        if self.batch_invariant:
            return (x.to(torch.float64) @ self._wide_weight(w).T).to(self.dtype)
        return F.linear(x, w)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]; statistics in float32 (float64 when batch invariant)."""
        acc = torch.float64 if self.batch_invariant else torch.float32
        xf = x.to(acc)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        return (normed * weight.to(acc)).to(self.dtype)

    def rotary_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, head_dim / 2] of ``positions`` (gathered once per forward)."""
        return self.rope_cos[positions][:, None, :], self.rope_sin[positions][:, None, :]

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half rotary embedding: x [T, heads, head_dim] with tables [T, 1, head_dim / 2]."""
        xf = x.to(cos.dtype)
        half = x.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(self.dtype)

    def mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]."""
        h = self.linear(x, layer.w_in)  # [T, 2 * inter] or [T, inter]
        acc = torch.float64 if self.batch_invariant else h.dtype
        if self.spec.mlp == "gated":
            gate, up = h.to(acc).chunk(2, dim=-1)
            act = (F.silu(gate) * up).to(self.dtype)  # [T, inter]
        else:
            act = F.gelu(h.to(acc)).to(self.dtype)
        return self.linear(act, layer.w_down)

    # ------------------------------------------------------------------ forward
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor,
                attention: AttentionFn) -> torch.Tensor:
        """Hidden states [T, hidden] (before the final norm) of tokens at ``positions``.

        token_ids [T] (any non-negative ids: taken modulo the vocabulary), positions [T].
        ``attention`` is called once per layer with the rotated q and k and the new v.
        """
        T = token_ids.shape[0]
        nh, nkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        x = self.embed[token_ids.long() % self.vocab_size]  # [T, hidden]
        cos, sin = self.rotary_tables(positions.long())
        for index, layer in enumerate(self.layers):
            qkv = self.linear(self.rms_norm(x, layer.attn_norm), layer.wqkv)  # [T, (nh + 2 nkv) d]
            q = qkv[:, :nh * d].view(T, nh, d)
            k = qkv[:, nh * d:(nh + nkv) * d].view(T, nkv, d)
            v = qkv[:, (nh + nkv) * d:].reshape(T, nkv, d)
            q, k = self.rotary(q, cos, sin), self.rotary(k, cos, sin)
            attn = attention(index, q, k, v)  # [T, nh, d]
            x = x + self.linear(attn.reshape(T, nh * d), layer.wo)
            x = x + self.mlp(layer, self.rms_norm(x, layer.mlp_norm))
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> float32 logits [n, vocab]."""
        return self.linear(self.rms_norm(hidden, self.final_norm), self.lm_head).float()

    def dense_logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Full recompute without any cache: float32 logits [T, vocab] of one sequence."""
        positions = torch.arange(token_ids.shape[0], device=self.device)

        def attend(_layer: int, q, k, v):
            return dense_causal_attention(q, k, v, 0, batch_invariant=self.batch_invariant)

        return self.logits(self.forward(token_ids.to(self.device), positions, attend))


def exact_attention(
    q: torch.Tensor,  # [rows, num_heads, head_dim]: queries at positions q_start .. q_start + rows - 1
    k: torch.Tensor,  # [length, num_kv_heads, head_dim]: keys at positions 0 .. length - 1
    v: torch.Tensor,  # [length, num_kv_heads, head_dim]
    q_start: int,
    scale: float,
) -> torch.Tensor:  # [rows, num_heads, head_dim], dtype of q
    """Causal attention accumulated in float64, rounded to q's dtype (the batch-invariant path).

    Prefill chunks and decode tokens both come here, so a token's attention is the same
    function of its query and its sequence's keys whichever path computed it.
    """
    rows, num_heads, head_dim = q.shape
    length, num_kv_heads = k.shape[0], k.shape[1]
    group = num_heads // num_kv_heads
    kd = k.to(torch.float64).permute(1, 2, 0)  # [kv_heads, head_dim, length]
    vd = v.to(torch.float64).permute(1, 0, 2)  # [kv_heads, length, head_dim]
    qd = (q.to(torch.float64).view(rows, num_kv_heads, group, head_dim)
          .permute(1, 2, 0, 3).reshape(num_kv_heads, group * rows, head_dim))  # [kv_heads, group*rows, head_dim]
    scores = torch.bmm(qd, kd) * scale  # [kv_heads, group * rows, length]
    if q_start + rows < length or rows > 1:
        positions = (q_start + torch.arange(rows, device=q.device)).repeat(group)  # [group * rows]
        keys = torch.arange(length, device=q.device)
        scores.masked_fill_(keys[None, None, :] > positions[None, :, None], float("-inf"))
    out = torch.bmm(torch.softmax(scores, dim=-1), vd)  # [kv_heads, group * rows, head_dim]
    return (out.view(num_kv_heads, group, rows, head_dim).permute(2, 0, 1, 3)
            .reshape(rows, num_heads, head_dim).to(q.dtype))


def dense_causal_attention(
    q: torch.Tensor,  # [n, num_heads, head_dim]: the queries at positions q_start .. q_start + n - 1
    k: torch.Tensor,  # [q_start + n, num_kv_heads, head_dim]: keys at positions 0 .. q_start + n - 1
    v: torch.Tensor,  # [q_start + n, num_kv_heads, head_dim]
    q_start: int,
    *,
    batch_invariant: bool = False,
    scale: float | None = None,
) -> torch.Tensor:  # [n, num_heads, head_dim], dtype of q
    """Causal attention of a chunk of queries over the keys before and at their position."""
    n, num_heads, head_dim = q.shape
    length = k.shape[0]
    if length != q_start + n:
        raise ValueError(f"keys cover {length} positions but queries end at {q_start + n}")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    if batch_invariant:
        out = torch.empty_like(q)
        # query blocks bound the score tensor and skip keys past the block; rows are
        # independent, so blocking changes no row's result
        for r0 in range(0, n, EXACT_QUERY_BLOCK):
            r1 = min(n, r0 + EXACT_QUERY_BLOCK)
            end = q_start + r1
            out[r0:r1] = exact_attention(q[r0:r1], k[:end], v[:end], q_start + r0, scale)
        return out
    group = num_heads // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)  # [length, num_heads, head_dim]
        v = v.repeat_interleave(group, dim=1)
    qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if q_start == 0:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
    else:
        visible = (torch.arange(length, device=q.device)[None, :]
                   <= (q_start + torch.arange(n, device=q.device))[:, None])
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=visible, scale=scale)
    return out[0].transpose(0, 1)  # [n, heads, head_dim]


def exact_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]: each sequence's query at position len - 1
    k_slots: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]: one layer's cache, flat
    v_slots: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    slot_index: torch.Tensor,  # [num_seqs, >= max len] long: slot of each position
    context_lens: list[int],
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim], dtype of q
    """Decode attention on the batch-invariant path: each sequence's keys read through its
    slot index (block table or start offset), then ``exact_attention``. Only positions
    below each length are read, so never-written slots are never touched."""
    out = torch.empty_like(q)
    for i, length in enumerate(context_lens):
        index = slot_index[i, :length]
        out[i:i + 1] = exact_attention(q[i:i + 1], k_slots.index_select(0, index),
                                       v_slots.index_select(0, index), length - 1, scale)
    return out
