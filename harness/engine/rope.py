"""Rotary position embedding tables from a ``ModelSpec``: theta and scaling as config.json says.

``inverse_frequencies`` follows the published definitions (RoFormer, Su et al. 2021, with
base ``rope_theta``; ``linear`` scaling divides every frequency by ``factor``; ``llama3``
scaling, Meta's Llama-3.1 reference code ``apply_scaling``: wavelengths longer than
``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, shorter
than ``.../ high_freq_factor`` are kept, and the band between is blended linearly in
``original / wavelength``). The tables are computed once in float64, so gathering them by
position is exact and batch invariant.
"""

from __future__ import annotations

import math

import torch

from harness.config.specs import ModelSpec


def inverse_frequencies(spec: ModelSpec) -> torch.Tensor:
    """float64 [head_dim / 2]: the rotation frequency of each pair of channels."""
    half = spec.head_dim // 2
    inv_freq = spec.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2.0 / spec.head_dim)
    scaling = spec.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    original = scaling.original_max_position_embeddings
    low_wavelen = original / scaling.low_freq_factor  # longer than this: scaled by 1 / factor
    high_wavelen = original / scaling.high_freq_factor  # shorter than this: kept
    wavelen = 2 * math.pi / inv_freq
    smooth = ((original / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    return torch.where(wavelen > low_wavelen, inv_freq / scaling.factor,
                       torch.where(wavelen < high_wavelen, inv_freq, blended))


def rotary_tables(spec: ModelSpec, positions: int, device: torch.device,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [positions, head_dim / 2] in ``dtype`` on ``device``."""
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inverse_frequencies(spec))
    return angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)
