"""The torch executor's weights: seeded random ones of a spec's dimensions, or a local
Hugging Face checkpoint's ``*.safetensors`` mapped into the model's fused projections.

``Weights`` holds one model's tensors in the fused layout ``harness.engine.model`` runs:
per layer one ``wqkv`` (q; k; v rows), one ``w_in`` (gate; up rows for the gated MLP,
fc1 for the others), and optional biases (Qwen2's q/k/v; OPT's on every projection and
norm). ``load_checkpoint`` reads a single ``model.safetensors`` or the shards listed in
``model.safetensors.index.json`` through ``safetensors`` (no downloads), tensor by tensor,
each converted to the model dtype on the device as it is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from harness.config.specs import ModelSpec
from harness.errors import ConfigError, InputError

OPT_POSITION_OFFSET = 2  # OPT's learned positions start at row 2 (OPTLearnedPositionalEmbedding)


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [hidden]
    wqkv: torch.Tensor  # [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
    wo: torch.Tensor  # [hidden, num_heads * head_dim]
    mlp_norm: torch.Tensor  # [hidden]
    w_in: torch.Tensor  # gated: [2 * intermediate, hidden] (gate; up), else [intermediate, hidden]
    w_down: torch.Tensor  # [hidden, intermediate]
    bqkv: torch.Tensor | None = None  # [(num_heads + 2 * num_kv_heads) * head_dim]
    bo: torch.Tensor | None = None  # [hidden]
    b_in: torch.Tensor | None = None  # [intermediate]
    b_down: torch.Tensor | None = None  # [hidden]
    attn_norm_bias: torch.Tensor | None = None  # [hidden] (LayerNorm)
    mlp_norm_bias: torch.Tensor | None = None  # [hidden]


@dataclass
class Weights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [vocab, hidden] (the embedding itself when tied)
    final_norm_bias: torch.Tensor | None = None  # [hidden]
    positions: torch.Tensor | None = None  # OPT: [max_context + 2, hidden] learned positions
    source: str = field(default="random")  # "random" or the checkpoint directory

    def tensors(self) -> list[torch.Tensor]:
        """Every distinct tensor (the tied LM head once)."""
        out = [t for t in (self.embed, self.final_norm, self.final_norm_bias, self.positions)
               if t is not None]
        for layer in self.layers:
            out.extend(t for t in (getattr(layer, f.name) for f in fields(layer)) if t is not None)
        if self.lm_head is not self.embed:
            out.append(self.lm_head)
        return out


def random_weights(spec: ModelSpec, device: torch.device, dtype: torch.dtype, seed: int) -> Weights:
    """N(0, 1/fan_in) projections, unit norms, zero biases, drawn from one seeded generator."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))

    def randn(shape: tuple[int, int], std: float) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype, device=device)
        rows = max(1, (1 << 26) // shape[1])  # float32 slabs of <= 256 MiB
        for start in range(0, shape[0], rows):
            count = min(rows, shape[0] - start)
            slab = torch.empty((count, shape[1]), dtype=torch.float32, device=device)
            out[start:start + count] = slab.normal_(0.0, std, generator=gen)
        return out

    def const(n: int, value: float) -> torch.Tensor:
        return torch.full((n,), value, dtype=dtype, device=device)

    hidden, inter = spec.hidden_size, spec.intermediate_size
    qkv_out = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
    attn_width = spec.num_heads * spec.head_dim
    opt = spec.architecture == "opt"
    embed = randn((spec.vocab_size, hidden), 1.0)
    layers = []
    for _ in range(spec.layers):
        layer = LayerWeights(
            attn_norm=const(hidden, 1.0), wqkv=randn((qkv_out, hidden), hidden ** -0.5),
            wo=randn((hidden, attn_width), attn_width ** -0.5), mlp_norm=const(hidden, 1.0),
            w_in=randn((2 * inter if spec.mlp == "gated" else inter, hidden), hidden ** -0.5),
            w_down=randn((hidden, inter), inter ** -0.5))
        if spec.attention_bias or opt:
            layer.bqkv = const(qkv_out, 0.0)
        if opt:
            layer.bo, layer.b_in, layer.b_down = const(hidden, 0.0), const(inter, 0.0), const(hidden, 0.0)
            layer.attn_norm_bias, layer.mlp_norm_bias = const(hidden, 0.0), const(hidden, 0.0)
        layers.append(layer)
    lm_head = embed if spec.tied_embeddings else randn((spec.vocab_size, hidden), hidden ** -0.5)
    weights = Weights(embed, layers, const(hidden, 1.0), lm_head)
    if opt:
        weights.final_norm_bias = const(hidden, 0.0)
        weights.positions = randn((spec.max_context + OPT_POSITION_OFFSET, hidden), 1.0)
    return weights


def checkpoint_files(directory: Path) -> list[Path]:
    """The checkpoint's safetensors files: the index's shards, or model.safetensors."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"not a safetensors index ({exc!r})", path=str(index),
                             field="weight_map") from None
        files = [directory / name for name in names]
    else:
        files = [directory / "model.safetensors"]
    for file in files:
        if not file.is_file():
            raise ConfigError(f"model.path={directory}: {file.name} is missing (a checkpoint is "
                              "config.json plus model.safetensors or the shards its index lists)")
    return files


class _Reader:
    """Tensors by name across the checkpoint's files, each read once, cast onto the device."""

    def __init__(self, directory: Path, device: torch.device, dtype: torch.dtype) -> None:
        from safetensors import safe_open
        from safetensors import SafetensorError

        self.device, self.dtype, self.directory = device, dtype, directory
        self.where: dict[str, object] = {}
        self.handles = []
        for file in checkpoint_files(directory):
            try:
                handle = safe_open(str(file), framework="pt")
            except (SafetensorError, OSError) as exc:
                raise InputError(f"not a safetensors file ({exc})", path=str(file)) from None
            self.handles.append(handle)
            for name in handle.keys():
                self.where[name] = handle

    def shape(self, name: str) -> tuple[int, ...]:
        handle = self.where.get(name)
        return tuple(handle.get_slice(name).get_shape()) if handle is not None else (0,)

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        handle = self.where.get(name)
        if handle is None:
            raise ConfigError(f"model.path={self.directory}: tensor {name!r} is missing from "
                              "the checkpoint")
        tensor = handle.get_tensor(name)
        if tuple(tensor.shape) != shape:
            raise ConfigError(f"model.path={self.directory}: tensor {name!r} has shape "
                              f"{tuple(tensor.shape)}, config.json says {shape}")
        return tensor.to(device=self.device, dtype=self.dtype)

    def cat(self, names: list[str], shapes: list[tuple[int, ...]]) -> torch.Tensor:
        return torch.cat([self.get(n, s) for n, s in zip(names, shapes)], dim=0)


def load_checkpoint(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> Weights:
    """``spec.path``'s weights in the fused layout (``spec.layers`` layers of them)."""
    r = _Reader(Path(spec.path), device, dtype)
    hidden, inter, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q_rows, kv_rows = spec.num_heads * d, spec.num_kv_heads * d
    opt = spec.architecture == "opt"
    top = "model.decoder" if opt else "model"
    embed = r.get(f"{top}.embed_tokens.weight", (spec.vocab_size, hidden))
    layers = []
    for i in range(spec.layers):
        p = f"{top}.layers.{i}"
        attn = f"{p}.self_attn"
        proj = [f"{attn}.{n}_proj" for n in "qkv"]
        qkv_shapes = [(q_rows, hidden), (kv_rows, hidden), (kv_rows, hidden)]
        layer = LayerWeights(
            attn_norm=r.get(f"{p}.{'self_attn_layer_norm' if opt else 'input_layernorm'}.weight", (hidden,)),
            wqkv=r.cat([f"{n}.weight" for n in proj], qkv_shapes),
            wo=r.get(f"{attn}.{'out_proj' if opt else 'o_proj'}.weight", (hidden, q_rows)),
            mlp_norm=r.get(f"{p}.{'final_layer_norm' if opt else 'post_attention_layernorm'}.weight", (hidden,)),
            w_in=(r.get(f"{p}.fc1.weight", (inter, hidden)) if opt else
                  r.cat([f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"], [(inter, hidden)] * 2)),
            w_down=r.get(f"{p}.{'fc2' if opt else 'mlp.down_proj'}.weight", (hidden, inter)))
        if spec.attention_bias or opt:
            layer.bqkv = r.cat([f"{n}.bias" for n in proj], [(q_rows,), (kv_rows,), (kv_rows,)])
        if opt:
            layer.bo = r.get(f"{attn}.out_proj.bias", (hidden,))
            layer.b_in, layer.b_down = r.get(f"{p}.fc1.bias", (inter,)), r.get(f"{p}.fc2.bias", (hidden,))
            layer.attn_norm_bias = r.get(f"{p}.self_attn_layer_norm.bias", (hidden,))
            layer.mlp_norm_bias = r.get(f"{p}.final_layer_norm.bias", (hidden,))
        layers.append(layer)
    norm = f"{top}.final_layer_norm" if opt else f"{top}.norm"
    lm_head = embed if spec.tied_embeddings else r.get("lm_head.weight", (spec.vocab_size, hidden))
    weights = Weights(embed, layers, r.get(f"{norm}.weight", (hidden,)), lm_head, source=spec.path)
    if opt:
        weights.final_norm_bias = r.get(f"{norm}.bias", (hidden,))
        name = f"{top}.embed_positions.weight"
        rows = r.shape(name)[0]  # model.max_context may be below the checkpoint's
        weights.positions = r.get(name, (rows, hidden))[:spec.max_context + OPT_POSITION_OFFSET]
    return weights
