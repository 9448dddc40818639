"""The Llama-family decoder over a flattened ragged batch and a paged KV cache.

One forward computes the new tokens of many requests at once (``input_ids`` [T]); every layer
writes all new K/V into their slots *before* any attention of that layer reads the cache, so a
request can read a prefix block that another request of the same batch computes in this step.
Only the rows in ``logits_indices`` (last token of each sampled request) reach the LM head.

``dtype`` is the dtype of the residual stream, the norms, RoPE, attention and the KV cache; the
linears compute in their weights' dtype (``linear.py``). They differ on the CPU with bf16
weights, where the rest stays float32 on kvgate's C kernels (``engine/runtime/device.py``).
"""

from __future__ import annotations

import torch

from engine.runtime.kernels import paged_attention, rms_norm, rope_store_kv, silu_mul
from engine.runtime.kernels.cpu import layers as cpu_layers
from engine.runtime.kernels.cpu import ops as cpu_ops
from engine.runtime.kernels.cpu.qgemm import FLOAT32
from engine.runtime.kernels.metadata import AttentionMetadata
from engine.runtime.model.blocks import embed
from engine.runtime.model.config import ModelConfig
from engine.runtime.model.linear import Linear
from engine.runtime.model.rope import inv_freq as rope_inv_freq
from engine.runtime.model.weights import LayerWeights, ModelWeights

KVCache = tuple[torch.Tensor, torch.Tensor]  # k, v: [num_blocks, block_size, Hkv, D]


class _Layer:
    def __init__(
        self, w: LayerWeights, cfg: ModelConfig, dtype: torch.dtype, activations: str
    ) -> None:
        self.input_norm, self.post_norm = w.input_norm.to(dtype), w.post_norm.to(dtype)
        self.qkv = Linear(w.qkv, w.qkv_bias, activations=activations)
        self.o_proj = Linear(w.o_proj, w.o_bias, activations=activations)
        self.gate_up = Linear(w.gate_up, activations=activations)
        self.down = Linear(w.down, activations=activations)
        self.eps = cfg.rms_norm_eps
        self.heads = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        self.inter = cfg.intermediate_size

    def spec(self) -> cpu_layers.LayerSpec | None:
        """This layer as the fused CPU loop reads it, where every linear is in GGUF blocks."""
        linears = (self.qkv, self.o_proj, self.gate_up, self.down)
        blocks = [(w.blocks, w.bias) for w in linears if w.blocks is not None]
        norms = (self.input_norm, self.post_norm)
        if len(blocks) < len(linears) or not all(cpu_ops.plain_cpu(n) for n in norms):
            return None
        return cpu_layers.LayerSpec(self.input_norm, self.post_norm, *blocks)


def _fused(layers: list[_Layer], cfg: ModelConfig) -> cpu_layers.FusedLayers | None:
    """One C call for all layers of a CPU forward (``engine/runtime/kernels/cpu/layers.py``),
    where every layer qualifies; None keeps the per-op loop below."""
    specs = [layer.spec() for layer in layers]
    if not specs or None in specs:
        return None
    shape = cpu_layers.Shape(
        cfg.hidden_size,
        (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
        cfg.intermediate_size,
        cfg.rms_norm_eps,
        cfg.head_dim**-0.5,
    )
    return cpu_layers.load([s for s in specs if s is not None], shape)


class Decoder:
    """Stateless forward; K/V live in the caller's cache tensors. ``activations``: the
    precision in which the linears whose weights are in GGUF blocks meet their input (float32,
    or rounded to int16 / int8 per block of 32: ``engine/runtime/kernels/cpu/qgemm.py``)."""

    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights,
        dtype: torch.dtype,
        device: str,
        *,
        activations: str = FLOAT32,
    ) -> None:
        self.cfg = cfg
        self.dtype = dtype
        self.embed = weights.embed
        self.norm = weights.norm.to(dtype)
        self.lm_head = Linear(weights.lm_head, activations=activations)
        self.layers = [_Layer(w, cfg, dtype, activations) for w in weights.layers]
        self.scale = cfg.head_dim**-0.5
        # cos/sin tables [max_position, D], computed in float32 as HF does, then cast.
        inv_freq = rope_inv_freq(cfg.rope, cfg.head_dim)
        pos = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(dtype=dtype, device=device)
        self.sin = emb.sin().to(dtype=dtype, device=device)
        # every layer in one C call (same kernels, same bits as the loop in forward); tests set
        # it to None to compare the two
        self.fused: cpu_layers.FusedLayers | None = None
        if dtype == torch.float32 and torch.device(device).type == "cpu":
            self.fused = _fused(self.layers, cfg)

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
        x = embed(self.embed, input_ids).to(self.dtype)  # the residual stream; its own buffer
        delta: torch.Tensor | None = None  # the last MLP output, added by the next norm
        if self.fused is not None:
            delta = self.fused.run(x, positions, self.cos, self.sin, meta, kv_caches)
        if delta is None:
            for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
                x, delta = self._layer(layer, x, delta, positions, meta, k_cache, v_cache)
        x = x.index_select(0, logits_indices)
        if delta is None:  # no layers
            return self.lm_head(rms_norm(x, self.norm, self.cfg.rms_norm_eps)).float()
        normed, _ = rms_norm(
            delta.index_select(0, logits_indices), self.norm, self.cfg.rms_norm_eps, residual=x
        )
        return self.lm_head(normed).float()

    def _layer(
        self,
        layer: _Layer,
        x: torch.Tensor,
        delta: torch.Tensor | None,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual stream, pending delta) -> the same after this layer. Each residual add is
        fused into the RMSNorm that follows it."""
        t = x.shape[0]
        hq, hkv, d = layer.heads
        if delta is None:
            h = rms_norm(x, layer.input_norm, layer.eps)
        else:
            h, x = rms_norm(delta, layer.input_norm, layer.eps, residual=x)
        qkv = layer.qkv(h)
        q = qkv[:, : hq * d].view(t, hq, d)
        k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
        v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
        # All new K/V of the batch land in the cache before any request's attention reads it.
        rope_store_kv(q, k, v, positions, self.cos, self.sin, k_cache, v_cache, meta.slot_mapping)
        attn = paged_attention(q.contiguous(), k_cache, v_cache, meta, self.scale)
        out = layer.o_proj(attn.reshape(t, hq * d))
        h, x = rms_norm(out, layer.post_norm, layer.eps, residual=x)
        return x, layer.down(silu_mul(layer.gate_up(h), layer.inter))
