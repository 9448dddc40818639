"""The Llama-family decoder over a flattened ragged batch and a paged KV cache.

One forward computes the new tokens of many requests at once (``input_ids`` [T]); every layer
writes all new K/V into their slots *before* any attention of that layer reads the cache, so a
request can read a prefix block that another request of the same batch computes in this step.
Only the rows in ``logits_indices`` (last token of each sampled request) reach the LM head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import paged_attention, store_kv
from engine.kernels.metadata import AttentionMetadata
from engine.model.config import ModelConfig
from engine.model.linear import Linear
from engine.model.loader import LayerWeights, ModelWeights

KVCache = tuple[torch.Tensor, torch.Tensor]  # k, v: [num_blocks, block_size, Hkv, D]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # Half precision: normalise in float32 and cast back before the weight, as HF does.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Layer:
    def __init__(self, w: LayerWeights, cfg: ModelConfig) -> None:
        self.input_norm, self.post_norm = w.input_norm, w.post_norm
        self.qkv = Linear(w.qkv, w.qkv_bias)
        self.o_proj = Linear(w.o_proj, w.o_bias)
        self.gate_up = Linear(w.gate_up)
        self.down = Linear(w.down)
        self.eps = cfg.rms_norm_eps
        self.heads = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        self.inter = cfg.intermediate_size


class Decoder:
    """Stateless forward; K/V live in the caller's cache tensors."""

    def __init__(
        self, cfg: ModelConfig, weights: ModelWeights, dtype: torch.dtype, device: str
    ) -> None:
        self.cfg = cfg
        self.dtype = dtype
        self.embed = weights.embed
        self.norm = weights.norm
        self.lm_head = Linear(weights.lm_head)
        self.layers = [_Layer(w, cfg) for w in weights.layers]
        self.scale = cfg.head_dim**-0.5
        # cos/sin per absolute position, computed in float32 as HF does, then cast.
        inv_freq = cfg.rope.inv_freq(cfg.head_dim)
        pos = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(dtype=dtype, device=device)
        self.sin = emb.sin().to(dtype=dtype, device=device)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """input_ids/positions [T] -> float32 logits [len(logits_indices), V]."""
        x = F.embedding(input_ids, self.embed)
        cos = self.cos[positions].unsqueeze(1)  # [T, 1, D]
        sin = self.sin[positions].unsqueeze(1)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x = self._layer(layer, x, cos, sin, meta, k_cache, v_cache)
        x = x.index_select(0, logits_indices)
        x = rms_norm(x, self.norm, self.cfg.rms_norm_eps)
        return self.lm_head(x).float()

    def _layer(
        self,
        layer: _Layer,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        t = x.shape[0]
        hq, hkv, d = layer.heads
        h = rms_norm(x, layer.input_norm, layer.eps)
        qkv = layer.qkv(h)
        # RoPE on q and k heads together: [T, Hq + Hkv, D] in one pass.
        qk = qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d)
        qk = qk * cos + _rotate_half(qk) * sin
        q, k = qk[:, :hq].contiguous(), qk[:, hq:].contiguous()  # kernels take dense [T, H, D]
        v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
        # All new K/V of the batch land in the cache before any request's attention reads it.
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        attn = paged_attention(q, k_cache, v_cache, meta, self.scale)
        x.add_(layer.o_proj(attn.reshape(t, hq * d)))  # x is this forward's own buffer
        h = rms_norm(x, layer.post_norm, layer.eps)
        gate, up = layer.gate_up(h).split((layer.inter, layer.inter), dim=-1)
        act = F.silu(gate, inplace=True).mul_(up)  # in place: the fused output is a temporary
        return x.add_(layer.down(act))
