"""The decoder's weights as loaded, whatever the checkpoint format: one home for the types
that the safetensors loader (``loader.py``), the GGUF loader (``gguf.py``) and the decoder share.

q/k/v and gate/up are fused into one matrix each, so a layer runs four matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.config import ModelConfig
from engine.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [q_size + 2 * kv_size, H]
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor  # [H, q_size]
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 * I, H]
    down: torch.Tensor  # [H, I]


@dataclass(frozen=True)
class ModelWeights:
    embed: torch.Tensor  # [V, H]
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]; the embedding itself when tied


@dataclass(frozen=True)
class LoadedModel:
    config: ModelConfig
    tokenizer: Tokenizer
    weights: ModelWeights
    dtype: torch.dtype
