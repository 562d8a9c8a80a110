"""Attention work by layer group, for the cost models (``harness.models.model_layers``' groups).

A uniform full-attention model (one ``full`` group: Llama, OPT, Qwen) is priced as it
always was, from the step's (query, key) pairs and KV slots; ``layered_attention`` returns
None for it, so its cost models take no extra work a step. Every other model's attention
is priced a group at a time:

* ``full`` layers: a decode reads the K and V of its whole context and its own token; a
  prefill chunk's token at position p attends p + 1 keys (causal pairs);
  ``4 x heads x head_dim`` FLOPs a pair and layer (QK^T and PV, 2 FLOPs a multiply-add).
* ``mla`` layers (DeepSeek-V2/V3): a decode reads one latent of ``kv_lora_rank`` plus a
  ``qk_rope_head_dim`` rope key a token and layer (``bytes_per_slot``'s convention). Decode
  runs absorbed (every query head attends the latent, keys of d_k = kv_lora_rank + rope
  dims, values of d_v = kv_lora_rank): ``2 x heads x (d_k + d_v)`` FLOPs a pair and layer,
  as FlashMLA counts them (github.com/deepseek-ai/FlashMLA/blob/main/docs/20250422-new-kernel-deep-dive.md:
  FLOPs = 2 h_q s_q s_k (d_k + d_v), bytes ~ 2 s_k d_k, so ~2 h_q FLOPs a byte: compute
  bound once h_q x s_q >= 128 on an H800). With 128 heads and a bf16 latent that is
  278,528 FLOPs for 1,152 bytes, 242 FLOPs a byte, whatever the batch (each sequence reads
  its own latent): above an H200's spec ridge (989 TFLOPS / 4.8 TB/s = 206), so decode
  attention is priced ``max(bytes / bandwidth, FLOPs / peak)``. Prefill runs unabsorbed
  (vLLM's MLA backends expand the latent to per-head K and V for prefill):
  ``2 x heads x (qk_nope + rope + v_head_dim)`` FLOPs a causal pair and layer.
* ``sliding`` layers (window W): the query at position p attends min(p + 1, W) keys; a
  decode reads that many tokens' KV; a chunk's cached read is min(start, W - 1) tokens.
* ``linear`` layers (Gated DeltaNet): no pairs and no context. Each computed sequence
  reads its recurrent state once a step and writes it once (``LayerGroup.state_bytes``);
  FLOPs are linear in tokens: per token, layer and value head the recurrence
  S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T, o_t = S_t q_t (Yang et al.,
  Gated Delta Networks, ICLR 2025) costs S k (2 d_k d_v), the decay (d_k d_v), the rank-1
  update (2 d_k d_v) and S q (2 d_k d_v): 7 d_k d_v; plus the causal convolution's
  2 x conv_kernel FLOPs a channel (2 key_dim + value_dim channels).

Every layer writes each computed token's KV (``full``, ``mla``, ``sliding``); linear
layers write their state, not a token's KV.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from harness.config.specs import ModelSpec

# What ``plan_work`` counts in a step (the order of its tuple).
WORK = ("prefill_pairs", "prefill_window", "prefill_seqs", "prefill_tokens", "decode_pairs",
        "decode_window", "decode_seqs", "window_read")


@dataclass(frozen=True)
class LayeredAttention:
    """A model's attention work coefficients, summed over each kind's layers."""

    context_bytes: int  # KV bytes a context token in the full and MLA layers
    window_bytes: int  # KV bytes a windowed token in the sliding layers
    window: int  # the sliding layers' window (0: none)
    state_bytes: int  # the linear layers' recurrent state a sequence
    prefill_pair_flops: float  # full / MLA layers, a causal (query, key) pair of a prefill
    decode_pair_flops: float  # full / MLA layers, a decode's (query, key) pair
    window_pair_flops: float  # sliding layers, a (query, key) pair inside the window
    linear_token_flops: float  # linear layers, a computed token

    @property
    def kv_write_bytes(self) -> int:
        """KV bytes a computed token writes (every layer but the linear ones)."""
        return self.context_bytes + self.window_bytes

    def window_keys(self, start: int, end: int) -> int:
        """Keys the tokens at positions [start, end) attend in a sliding layer:
        sum over p of min(p + 1, W) (``window_prefix`` of end minus that of start)."""
        return window_prefix(end, self.window) - window_prefix(start, self.window)


def window_prefix(x: int, window: int) -> int:
    """sum of min(q, window) for q = 1 .. x."""
    if x <= window:
        return x * (x + 1) // 2
    return window * (window + 1) // 2 + (x - window) * window


class WindowSpan:
    """The sliding layers' decode reads along a fast-forwarded span: at step i each of
    the sequences at ``positions`` (tokens computed before the span) reads
    min(position + i + 1, W) tokens; the sum, exactly, for any i (integers)."""

    def __init__(self, positions: list[int], window: int) -> None:
        self.window, self.count = window, len(positions)
        # steps until each sequence's read reaches the window (<= 0: already there)
        self.headroom = sorted(window - p - 1 for p in positions)
        self.suffix = list(accumulate(reversed(self.headroom), initial=0))[::-1]  # [n + 1]

    def slots(self, step: int) -> int:
        """sum_j min(positions[j] + step + 1, W) = n W - sum_j max(0, headroom_j - step)."""
        k = bisect_right(self.headroom, step)  # sequences at the window by this step
        return self.count * self.window - (self.suffix[k] - step * (self.count - k))


def layered_attention(model: ModelSpec) -> LayeredAttention | None:
    """``model``'s attention coefficients by layer group, or None for a uniform
    full-attention model (priced from its pairs and ``bytes_per_slot``, as always)."""
    groups = {group.kind: group for group in model.layer_groups}
    if set(groups) == {"full"}:
        return None
    heads, head_dim = model.num_heads, model.head_dim
    gqa_pair = 4.0 * heads * head_dim  # a layer's QK^T and PV for one (query, key) pair
    context = groups.get("full") or groups.get("mla")
    context_layers = context.num_layers if context is not None else 0
    mla = model.mla
    if mla is not None:
        d_k = mla.kv_lora_rank + mla.qk_rope_head_dim
        prefill_pair = 2.0 * heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim)
        decode_pair = 2.0 * heads * (d_k + mla.kv_lora_rank)
    else:
        prefill_pair = decode_pair = gqa_pair
    sliding, linear = groups.get("sliding"), groups.get("linear")
    linear_token = 0.0
    if linear is not None:
        la = model.linear_attention
        key_dim, value_dim = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
        per_layer = (7 * la.num_value_heads * la.key_head_dim * la.value_head_dim
                     + 2 * la.conv_kernel * (2 * key_dim + value_dim))
        linear_token = float(linear.num_layers * per_layer)
    return LayeredAttention(
        context_bytes=context.bytes_per_token if context is not None else 0,
        window_bytes=sliding.bytes_per_token if sliding is not None else 0,
        window=sliding.window if sliding is not None else 0,
        state_bytes=linear.state_bytes if linear is not None else 0,
        prefill_pair_flops=context_layers * prefill_pair,
        decode_pair_flops=context_layers * decode_pair,
        window_pair_flops=(sliding.num_layers if sliding is not None else 0) * gqa_pair,
        linear_token_flops=linear_token)


def plan_work(plan, layers: LayeredAttention) -> tuple[int, ...]:
    """A step plan's attention work for ``layers``, as ``WORK``'s integers: a chunk of more
    than one token is a prefill; ``*_pairs`` count the full / MLA layers' causal pairs,
    ``*_window`` the sliding layers' (a decode's own token included), ``window_read`` the
    sliding layers' cached KV read before each chunk."""
    window = layers.window
    starts = plan.decode_starts
    if window:
        last = window - 1
        decode_window = sum(s if s < last else last for s in starts) + len(starts)
        window_read = decode_window - len(starts)
    else:
        decode_window = window_read = 0
    prefill_pairs = prefill_window = prefill_seqs = prefill_tokens = 0
    for chunk in plan.other_chunks:
        start, n = chunk.start, chunk.end - chunk.start
        keys = layers.window_keys(start, chunk.end) if window else 0
        if window:
            window_read += start if start < window - 1 else window - 1
        if n > 1:
            prefill_pairs += n * start + n * (n + 1) // 2
            prefill_window += keys
            prefill_seqs += 1 + len(chunk.members)
            prefill_tokens += n
        else:
            decode_window += keys
    return (prefill_pairs, prefill_window, prefill_seqs, prefill_tokens,
            plan.attention_pairs - prefill_pairs, decode_window, plan.num_seqs - prefill_seqs,
            window_read)


def decode_work(pairs: int, window_slots: int, num_seqs: int) -> tuple[int, ...]:
    """``plan_work`` of a step of ``num_seqs`` one-token decodes (no prefill)."""
    return (0, 0, 0, 0, pairs, window_slots, num_seqs, window_slots - num_seqs if window_slots else 0)
