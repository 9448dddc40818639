"""Rotary position embedding frequencies from a ``RopeConfig`` (config.py, torch-free)."""

from __future__ import annotations

import math

import torch

from engine.runtime.model.config import RopeConfig
from engine.text.errors import ModelLoadError


def inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Per-pair inverse frequencies [head_dim // 2], float32, the way HF computes them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv = 1.0 / (rope.theta**exponents)
    if rope.freq_factors is not None:
        if len(rope.freq_factors) != head_dim // 2:
            n = len(rope.freq_factors)
            raise ModelLoadError(f"rope_freqs: {n} factors, need {head_dim // 2}")
        return inv / torch.tensor(rope.freq_factors, dtype=torch.float32)
    if rope.kind == "linear":
        return inv / rope.factor
    if rope.kind != "llama3":
        return inv
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)
