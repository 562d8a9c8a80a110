"""The decoder the torch executor runs: seeded random weights or a local checkpoint's.

``architecture: llama`` (Llama, Mistral, Qwen2): RMSNorm -> fused QKV projection (with
Qwen2's biases) -> rotary embeddings (theta and scaling from the spec, ``rope.py``) ->
grouped-query attention -> output projection -> RMSNorm -> SwiGLU MLP (or GELU for
``mlp: gelu``), residuals, a final RMSNorm and the LM head. ``architecture: opt`` (OPT,
Zhang et al. 2022): learned positions added to the embedding, LayerNorm, no rotation,
biases on every projection, a ReLU MLP. Dimensions come from a ``ModelSpec``
(``conf/model`` or a checkpoint's config.json); weights from ``weights.py``;
``num_layers_override`` shortens the stack.

The model never sees the KV cache: ``forward`` takes an ``attention(layer, q, k, v)``
callback, and the executor decides where keys and values live (paged blocks or a
contiguous arena) and which kernel reads them. ``dense_causal_attention`` is the
no-cache attention of the same math, used by the tests' full-recompute reference.
A ``sliding_window`` spec (Mistral) lets each query see its last ``window`` keys.

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

from harness.config.specs import TORCH_ARCHITECTURES, ModelSpec
from harness.engine.rope import rotary_tables
from harness.errors import ConfigError
from harness.engine.weights import OPT_POSITION_OFFSET, LayerWeights, load_checkpoint, random_weights

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
EXACT_QUERY_BLOCK = 256  # query rows per block of the float64 prefill attention

# attention(layer, q [T, num_heads, head_dim], k [T, num_kv_heads, head_dim], v) -> [T, num_heads, head_dim]
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class DecoderModel:
    """``spec``'s model on ``device`` in ``spec.dtype``: ``spec.path``'s checkpoint weights,
    or seeded random weights of its dimensions when it has no path."""

    def __init__(self, spec: ModelSpec, *, device: str | torch.device = "cpu", seed: int = 0,
                 batch_invariant: bool = False) -> None:
        if spec.architecture not in TORCH_ARCHITECTURES or spec.kv_dtype not in (None, spec.dtype):
            key = "architecture" if spec.architecture not in TORCH_ARCHITECTURES else "kv_dtype"
            raise ConfigError(f"model.{key}: the torch executor builds {', '.join(TORCH_ARCHITECTURES)} "
                              f"with KV in the weights' dtype, not {getattr(spec, key)} (engine=sim sizes it)")
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = TORCH_DTYPES[spec.dtype]
        self.batch_invariant = bool(batch_invariant)
        self.num_layers = spec.layers
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.vocab_size = spec.vocab_size
        self.scale = 1.0 / math.sqrt(spec.head_dim)
        self.opt = spec.architecture == "opt"
        self.window = spec.sliding_window
        weights = (load_checkpoint(spec, self.device, self.dtype) if spec.path is not None
                   else random_weights(spec, self.device, self.dtype, seed))
        self.weights = weights
        self.embed, self.layers, self.lm_head = weights.embed, weights.layers, weights.lm_head
        self.final_norm, self.final_norm_bias = weights.final_norm, weights.final_norm_bias
        # Rotary tables [max_context, head_dim / 2], computed in float64 once: a gather by
        # position is exact, so rotary embeddings are batch invariant in every mode.
        table_dtype = torch.float64 if self.batch_invariant else torch.float32
        if not self.opt:
            self.rope_cos, self.rope_sin = rotary_tables(spec, spec.max_context, self.device, table_dtype)
        self._wide: dict[int, torch.Tensor] = {}  # float64 copies of weights (batch_invariant)

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights.tensors())

    # ------------------------------------------------------------------ ops
    def _wide_weight(self, w: torch.Tensor) -> torch.Tensor:
        key = id(w)
        wide = self._wide.get(key)
        if wide is None:
            wide = self._wide[key] = w.to(torch.float64)
        return wide

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ w.T + b``: x [T, in], w [out, in], b [out] or None -> [T, out] in the model dtype."""
        if self.batch_invariant:
            out = x.to(torch.float64) @ self._wide_weight(w).T
            return (out if b is None else out + self._wide_weight(b)).to(self.dtype)
        return F.linear(x, w, b)

    def norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm (llama) or LayerNorm (opt, with ``bias``): [T, hidden] -> [T, hidden];
        statistics in float32 (float64 when batch invariant)."""
        acc = torch.float64 if self.batch_invariant else torch.float32
        xf = x.to(acc)
        if self.opt:
            xf = xf - xf.mean(-1, keepdim=True)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.spec.norm_eps)
        normed = normed * weight.to(acc)
        return (normed if bias is None else normed + bias.to(acc)).to(self.dtype)

    def rotary_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, head_dim / 2] of ``positions`` (gathered once per forward)."""
        return self.rope_cos[positions][:, None, :], self.rope_sin[positions][:, None, :]

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half rotary embedding: x [T, heads, head_dim] with tables [T, 1, head_dim / 2]."""
        xf = x.to(cos.dtype)
        half = x.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(self.dtype)

    def mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, hidden]."""
        h = self.linear(x, layer.w_in, layer.b_in)  # [T, 2 * inter] or [T, inter]
        acc = torch.float64 if self.batch_invariant else h.dtype
        if self.spec.mlp == "gated":
            gate, up = h.to(acc).chunk(2, dim=-1)
            act = (F.silu(gate) * up).to(self.dtype)  # [T, inter]
        elif self.spec.mlp == "relu":
            act = F.relu(h)
        else:
            act = F.gelu(h.to(acc)).to(self.dtype)
        return self.linear(act, layer.w_down, layer.b_down)

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
        positions = positions.long()
        if self.opt:
            x = x + self.weights.positions[positions + OPT_POSITION_OFFSET]
        else:
            cos, sin = self.rotary_tables(positions)
        for index, layer in enumerate(self.layers):
            h = self.norm(x, layer.attn_norm, layer.attn_norm_bias)
            qkv = self.linear(h, layer.wqkv, layer.bqkv)  # [T, (nh + 2 nkv) d]
            q = qkv[:, :nh * d].view(T, nh, d)
            k = qkv[:, nh * d:(nh + nkv) * d].view(T, nkv, d)
            v = qkv[:, (nh + nkv) * d:].reshape(T, nkv, d)
            if not self.opt:
                q, k = self.rotary(q, cos, sin), self.rotary(k, cos, sin)
            attn = attention(index, q, k, v)  # [T, nh, d]
            x = x + self.linear(attn.reshape(T, nh * d), layer.wo, layer.bo)
            x = x + self.mlp(layer, self.norm(x, layer.mlp_norm, layer.mlp_norm_bias))
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> float32 logits [n, vocab]."""
        return self.linear(self.norm(hidden, self.final_norm, self.final_norm_bias), self.lm_head).float()

    def dense_logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Full recompute without any cache: float32 logits [T, vocab] of one sequence."""
        positions = torch.arange(token_ids.shape[0], device=self.device)

        def attend(_layer: int, q, k, v):
            return dense_causal_attention(q, k, v, 0, batch_invariant=self.batch_invariant,
                                          window=self.window)

        return self.logits(self.forward(token_ids.to(self.device), positions, attend))


def exact_attention(
    q: torch.Tensor,  # [rows, num_heads, head_dim]: queries at positions q_start .. q_start + rows - 1
    k: torch.Tensor,  # [length, num_kv_heads, head_dim]: keys at positions 0 .. length - 1
    v: torch.Tensor,  # [length, num_kv_heads, head_dim]
    q_start: int,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [rows, num_heads, head_dim], dtype of q
    """Causal attention accumulated in float64, rounded to q's dtype (the batch-invariant path).

    Prefill chunks and decode tokens both come here, so a token's attention is the same
    function of its query and its sequence's keys whichever path computed it. With a
    ``window``, a query at position p sees keys p - window + 1 .. p.
    """
    rows, num_heads, head_dim = q.shape
    length, num_kv_heads = k.shape[0], k.shape[1]
    group = num_heads // num_kv_heads
    kd = k.to(torch.float64).permute(1, 2, 0)  # [kv_heads, head_dim, length]
    vd = v.to(torch.float64).permute(1, 0, 2)  # [kv_heads, length, head_dim]
    qd = (q.to(torch.float64).view(rows, num_kv_heads, group, head_dim)
          .permute(1, 2, 0, 3).reshape(num_kv_heads, group * rows, head_dim))  # [kv_heads, group*rows, head_dim]
    scores = torch.bmm(qd, kd) * scale  # [kv_heads, group * rows, length]
    windowed = window is not None and length > window
    if q_start + rows < length or rows > 1 or windowed:
        positions = (q_start + torch.arange(rows, device=q.device)).repeat(group)  # [group * rows]
        keys = torch.arange(length, device=q.device)
        hidden = keys[None, None, :] > positions[None, :, None]
        if windowed:
            hidden |= keys[None, None, :] <= positions[None, :, None] - window
        scores.masked_fill_(hidden, float("-inf"))
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
    window: int | None = None,
) -> torch.Tensor:  # [n, num_heads, head_dim], dtype of q
    """Causal attention of a chunk of queries over the keys before and at their position
    (the last ``window`` of them with a sliding window)."""
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
            out[r0:r1] = exact_attention(q[r0:r1], k[:end], v[:end], q_start + r0, scale, window)
        return out
    group = num_heads // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)  # [length, num_heads, head_dim]
        v = v.repeat_interleave(group, dim=1)
    qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if q_start == 0 and (window is None or length <= window):
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
    else:
        keys = torch.arange(length, device=q.device)[None, :]
        queries = (q_start + torch.arange(n, device=q.device))[:, None]
        visible = keys <= queries
        if window is not None:
            visible &= keys > queries - window
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=visible, scale=scale)
    return out[0].transpose(0, 1)  # [n, heads, head_dim]


def exact_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]: each sequence's query at position len - 1
    k_slots: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]: one layer's cache, flat
    v_slots: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    slot_index: torch.Tensor,  # [num_seqs, >= max len] long: slot of each position
    context_lens: list[int],
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim], dtype of q
    """Decode attention on the batch-invariant path: each sequence's keys read through its
    slot index (block table or start offset), then ``exact_attention``. Only positions
    below each length are read, so never-written slots are never touched."""
    out = torch.empty_like(q)
    for i, length in enumerate(context_lens):
        index = slot_index[i, :length]
        out[i:i + 1] = exact_attention(q[i:i + 1], k_slots.index_select(0, index),
                                       v_slots.index_select(0, index), length - 1, scale, window)
    return out
