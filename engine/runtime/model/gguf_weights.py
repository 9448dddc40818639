"""GGUF weights: every tensor the decoder needs out of an opened GGUF file (``gguf.py``).

Every tensor is dequantized once at load time (``gguf.quants.dequantize``: F32, F16, BF16,
Q4_0/Q4_1/Q5_x/Q8_0, the K-quants, ...) to the engine dtype and mapped to the decoder's fused
layout, or, on a float32 CPU, Q4_1 / Q8_0 matrices are kept in their blocks (``blocks.py``).
llama.cpp stores Llama / Mistral q and k rows permuted for its rotary kernel; that permutation is
undone here (Qwen2 files are not permuted).

    GGUF name                         decoder field
    token_embd.weight                 embed              output_norm.weight   norm
    output.weight (absent: tied)      lm_head
    blk.N.attn_norm / ffn_norm        input_norm / post_norm
    blk.N.attn_{q,k,v}.{weight,bias}  qkv, qkv_bias      blk.N.attn_output    o_proj
    blk.N.ffn_{gate,up,down}          gate_up, down
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.runtime.model.blocks import BLOCK_BYTES, BlockWeight, cat_rows
from engine.runtime.model.config import ModelConfig
from engine.runtime.model.gguf import (
    PERMUTED_ARCHITECTURES,
    GGUFFile,
    dequantize_tensor,
    parse_gguf_config,
)
from engine.runtime.model.weights import (
    LayerWeights,
    LoadedModel,
    ModelWeights,
    resolve_dtype,
)
from engine.text.errors import ModelLoadError
from engine.text.gguf_tokenizer import gguf_tokenizer


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's convert ``permute``: per head, rows (pair, half) -> (half, pair)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class _Tensors:
    """Reads one GGUF tensor at a time: shape check, dequantize (or keep its blocks), cast."""

    def __init__(
        self, f: GGUFFile, cfg: ModelConfig, dtype: torch.dtype, device: str, blocks: bool
    ) -> None:
        self.f, self.dtype, self.device, self.blocks = f, dtype, device, blocks
        self.permute = f.arch in PERMUTED_ARCHITECTURES
        self.heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}

    def _check(self, name: str, shape: tuple[int, ...]) -> None:
        if name not in self.f.tensors:
            raise ModelLoadError(f"{self.f.path}: tensor {name!r} not found")
        actual = self.f.shape(name)
        if actual != shape:
            raise ModelLoadError(
                f"{self.f.path}: tensor {name!r} has shape {list(actual)}, expected {list(shape)}"
            )

    def weight(self, name: str, shape: tuple[int, int]) -> torch.Tensor | BlockWeight:
        """A matrix: kept in its block format when that is Q4_1 or Q8_0 and blocks are wanted."""
        self._check(name, shape)
        kind = self.f.tensors[name].tensor_type.name.lower()
        if not self.blocks or kind not in BLOCK_BYTES:
            return self.get(name, shape)
        w = BlockWeight.from_gguf(kind, self.f.tensors[name].data, shape)
        role = name.split(".")[-2]
        if self.permute and role in self.heads:
            heads = self.heads[role]
            w = w.map_rows(lambda t: _unpermute(t, heads))
        return w

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        self._check(name, shape)
        array = dequantize_tensor(self.f, name)
        if not array.flags.writeable:  # a view of the memory-mapped file
            array = array.copy()
        t = torch.from_numpy(array).to(self.dtype)
        kind = name.split(".")[-2]
        if self.permute and kind in self.heads:
            t = _unpermute(t, self.heads[kind])
        return t.to(self.device)


def _layer(r: _Tensors, cfg: ModelConfig, i: int) -> LayerWeights:
    p = f"blk.{i}."
    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    sizes = (("q", q), ("k", kv), ("v", kv))
    qkv = cat_rows([r.weight(f"{p}attn_{n}.weight", (s, h)) for n, s in sizes])
    qkv_bias = None
    if cfg.qkv_bias:
        qkv_bias = torch.cat([r.get(f"{p}attn_{n}.bias", (s,)) for n, s in sizes])
    return LayerWeights(
        input_norm=r.get(p + "attn_norm.weight", (h,)),
        qkv=qkv,
        qkv_bias=qkv_bias,
        o_proj=r.weight(p + "attn_output.weight", (h, q)),
        o_bias=r.get(p + "attn_output.bias", (h,)) if cfg.o_bias else None,
        post_norm=r.get(p + "ffn_norm.weight", (h,)),
        gate_up=cat_rows(
            [r.weight(p + "ffn_gate.weight", (inter, h)), r.weight(p + "ffn_up.weight", (inter, h))]
        ),
        down=r.weight(p + "ffn_down.weight", (h, inter)),
    )


def load_gguf_weights(
    f: GGUFFile, cfg: ModelConfig, dtype: torch.dtype, device: str, blocks: bool = False
) -> ModelWeights:
    """Every tensor the decoder needs, dequantized to ``dtype`` on ``device``; with ``blocks``,
    Q4_1 and Q8_0 matrices stay in their blocks (``blocks.py``)."""
    r = _Tensors(f, cfg, dtype, device, blocks)
    v, h = cfg.vocab_size, cfg.hidden_size
    embed = r.weight("token_embd.weight", (v, h))
    layers = tuple(_layer(r, cfg, i) for i in range(cfg.num_layers))
    lm_head = embed if cfg.tie_word_embeddings else r.weight("output.weight", (v, h))
    return ModelWeights(
        embed=embed, layers=layers, norm=r.get("output_norm.weight", (h,)), lm_head=lm_head
    )


def load_gguf(path: str | Path, dtype: str, device: str, blocks: bool = False) -> LoadedModel:
    """Config, tokenizer and weights of a GGUF file: dequantized, or with ``blocks`` (CPU,
    float32 only) its Q4_1 and Q8_0 matrices kept as they are stored."""
    f = GGUFFile.open(path)
    cfg = parse_gguf_config(f)
    torch_dtype = resolve_dtype(dtype, cfg)
    keep = blocks and torch_dtype == torch.float32 and torch.device(device).type == "cpu"
    tokenizer = gguf_tokenizer(f.metadata, str(f.path))
    weights = load_gguf_weights(f, cfg, torch_dtype, device, keep)
    return LoadedModel(cfg, tokenizer, weights, torch_dtype)
