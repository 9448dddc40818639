"""Lazy safetensors loading (memory-mapped ``safe_open``) into fused decoder weights.

Single-file and sharded checkpoints (``model.safetensors.index.json``) are supported. Each tensor is
checked against the shape ``ModelConfig`` implies before it is read; q/k/v and gate/up are fused
into one matrix each, so a layer runs four matmuls. ``load_model`` is the one entry point: an HF
model directory, or a ``.gguf`` file (``engine/runtime/model/gguf.py``).
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from engine.runtime.model.checkpoint import checkpoint_files, model_path, unreadable_safetensors
from engine.runtime.model.config import ModelConfig, parse_config
from engine.runtime.model.gguf_weights import load_gguf
from engine.runtime.model.weights import LayerWeights, LoadedModel, ModelWeights, resolve_dtype
from engine.text.errors import ModelLoadError
from engine.text.tokenizer import Tokenizer

PROGRESS_MIN_BYTES = 1 << 30  # show a progress bar only for checkpoints at least this large


class _Reader:
    """Name -> open shard; reads one tensor at a time, checking its shape first."""

    def __init__(self, files: list[Path], stack: ExitStack, dtype: torch.dtype, device: str):
        from safetensors import safe_open

        self.dtype, self.device = dtype, device
        self.where: dict[str, tuple[Path, Any]] = {}
        self.total_bytes = 0
        for path in files:
            try:
                handle = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            except Exception as exc:  # safetensors raises its own error types
                raise unreadable_safetensors(path, exc) from exc
            for name in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                self.where[name] = (path, handle)
            self.total_bytes += path.stat().st_size

    def has(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self.where:
            files = sorted({str(p) for p, _ in self.where.values()})
            raise ModelLoadError(f"tensor {name!r} not found in {', '.join(files)}")
        path, handle = self.where[name]
        actual = tuple(handle.get_slice(name).get_shape())
        if actual != shape:
            raise ModelLoadError(
                f"{path}: tensor {name!r} has shape {list(actual)}, expected {list(shape)}"
            )
        tensor: torch.Tensor = handle.get_tensor(name)  # safetensors' stubs leave it untyped
        return tensor.to(dtype=self.dtype)


def _load_layer(r: _Reader, cfg: ModelConfig, i: int, device: str) -> LayerWeights:
    p = f"model.layers.{i}."
    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    qkv = torch.cat(
        [
            r.get(p + f"self_attn.{n}_proj.weight", (s, h))
            for n, s in (("q", q), ("k", kv), ("v", kv))
        ]
    )
    qkv_bias = None
    if cfg.qkv_bias:
        parts = [
            r.get(p + f"self_attn.{n}_proj.bias", (s,)) for n, s in (("q", q), ("k", kv), ("v", kv))
        ]
        qkv_bias = torch.cat(parts).to(device)
    gate_up = torch.cat(
        [r.get(p + "mlp.gate_proj.weight", (inter, h)), r.get(p + "mlp.up_proj.weight", (inter, h))]
    )
    return LayerWeights(
        input_norm=r.get(p + "input_layernorm.weight", (h,)).to(device),
        qkv=qkv.to(device),
        qkv_bias=qkv_bias,
        o_proj=r.get(p + "self_attn.o_proj.weight", (h, q)).to(device),
        o_bias=r.get(p + "self_attn.o_proj.bias", (h,)).to(device) if cfg.o_bias else None,
        post_norm=r.get(p + "post_attention_layernorm.weight", (h,)).to(device),
        gate_up=gate_up.to(device),
        down=r.get(p + "mlp.down_proj.weight", (h, inter)).to(device),
    )


def load_weights(
    model_dir: Path, cfg: ModelConfig, dtype: torch.dtype, device: str
) -> ModelWeights:
    """Read every tensor the decoder needs (lazily, shard by shard) onto ``device``."""
    from tqdm import tqdm

    files = checkpoint_files(model_dir)
    with ExitStack() as stack:
        r = _Reader(files, stack, dtype, device)
        show = r.total_bytes >= PROGRESS_MIN_BYTES and sys.stderr.isatty()
        bar = tqdm(total=cfg.num_layers + 2, desc="loading weights", disable=not show)
        v, h = cfg.vocab_size, cfg.hidden_size
        embed = r.get("model.embed_tokens.weight", (v, h)).to(device)
        bar.update()
        layers = []
        for i in range(cfg.num_layers):
            layers.append(_load_layer(r, cfg, i, device))
            bar.update()
        norm = r.get("model.norm.weight", (h,)).to(device)
        tied = cfg.tie_word_embeddings
        lm_head = embed if tied else r.get("lm_head.weight", (v, h)).to(device)
        bar.update()
        bar.close()
    return ModelWeights(embed=embed, layers=tuple(layers), norm=norm, lm_head=lm_head)


def load_model(path: str | Path, dtype: str, device: str, blocks: bool = False) -> LoadedModel:
    """An HF model directory or a GGUF file -> config, tokenizer and weights on ``device``.

    ``dtype`` is EngineConfig.dtype ("auto" follows the checkpoint; GGUF dequantizes to float32).
    ``blocks``: a GGUF's Q4_1 and Q8_0 matrices are kept in their blocks on a float32 CPU."""
    path, kind = model_path(path)
    if kind == "gguf":
        return load_gguf(path, dtype, device, blocks)
    cfg = parse_config(path)
    torch_dtype = resolve_dtype(dtype, cfg)
    tokenizer = Tokenizer.from_pretrained(path)
    return LoadedModel(cfg, tokenizer, load_weights(path, cfg, torch_dtype, device), torch_dtype)
