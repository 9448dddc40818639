"""The decoder's weights as loaded, whatever the checkpoint format: one home for the types
that the safetensors loader (``loader.py``), the GGUF loader (``gguf.py``) and the decoder share.

q/k/v and gate/up are fused into one matrix each, so a layer runs four matmuls. A matrix is a
tensor or, from a GGUF file on the CPU, a :class:`BlockWeight` kept in its block format.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.runtime.model.blocks import BlockWeight
from engine.runtime.model.config import DTYPE_NAMES, ModelConfig, dtype_name
from engine.text.tokenizer import Tokenizer

Matrix = torch.Tensor | BlockWeight
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


def resolve_dtype(requested: str, model: ModelConfig) -> torch.dtype:
    """EngineConfig.dtype -> torch dtype (``dtype_name``: "auto" follows the checkpoint)."""
    return DTYPES[dtype_name(requested, model)]


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: Matrix  # [q_size + 2 * kv_size, H]
    qkv_bias: torch.Tensor | None
    o_proj: Matrix  # [H, q_size]
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor  # [H]
    gate_up: Matrix  # [2 * I, H]
    down: Matrix  # [H, I]


@dataclass(frozen=True)
class ModelWeights:
    embed: Matrix  # [V, H]
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor  # [H]
    lm_head: Matrix  # [V, H]; the embedding itself when tied


@dataclass(frozen=True)
class LoadedModel:
    config: ModelConfig
    tokenizer: Tokenizer
    weights: ModelWeights
    dtype: torch.dtype
