"""Random-weight models of real geometries for benchmarks (speed does not depend on weight values).

``make_random_model(path)`` writes a full HF model directory (config.json, model.safetensors,
generation_config.json and the demo tokenizer files), loadable by kvgate and by HF transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.runtime.model.config import ModelConfig, parse_config
from engine.runtime.model.demo import qwen2_config, random_state_dict, write_model_dir


@dataclass(frozen=True)
class Geometry:
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_pos: int
    rope_theta: float
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def describe(self, layers: int) -> str:
        return (
            f"hidden {self.hidden}, {layers} layers, {self.heads} heads, {self.kv_heads} KV heads, "
            f"head dim {self.head_dim}, intermediate {self.intermediate}, vocab {self.vocab}, "
            f"{'tied' if self.tied else 'untied'} embeddings"
        )


# Qwen2.5-0.5B (the reference geometry of docs/benchmarks).
QWEN25_05B = Geometry(
    hidden=896,
    heads=14,
    kv_heads=2,
    intermediate=4864,
    vocab=151936,
    max_pos=32768,
    rope_theta=1_000_000.0,
    tied=True,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def make_random_model(
    path: str | Path,
    *,
    arch: str = "qwen2",
    layers: int = 4,
    geometry: Geometry = QWEN25_05B,
    dtype: str | torch.dtype = "float32",
    seed: int = 0,
) -> Path:
    """Write a random model (``arch`` "qwen2" or "llama") to ``path`` and return the path."""
    if arch not in ("qwen2", "llama"):
        raise ValueError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    torch_dtype = _DTYPES[dtype] if isinstance(dtype, str) else dtype
    dtype_name = next(k for k, v in _DTYPES.items() if v == torch_dtype)
    g = geometry
    cfg = qwen2_config(
        hidden=g.hidden,
        layers=layers,
        heads=g.heads,
        kv_heads=g.kv_heads,
        intermediate=g.intermediate,
        vocab=g.vocab,
        max_pos=g.max_pos,
        rope_theta=g.rope_theta,
        tied=g.tied,
        dtype=dtype_name,
        arch=arch,
    )
    return write_model_dir(Path(path), cfg, random_state_dict(cfg, seed, torch_dtype))


def read_model_config(path: Path) -> ModelConfig:
    """The decoder config of an HF model directory or a GGUF file (no weights read)."""
    from engine.runtime.model.gguf import GGUFFile, parse_gguf_config
    from engine.text.gguf_reader import is_gguf

    return parse_gguf_config(GGUFFile.open(path)) if is_gguf(path) else parse_config(path)


def describe(cfg: ModelConfig) -> str:
    return (
        f"{cfg.architecture}: hidden {cfg.hidden_size}, {cfg.num_layers} layers, "
        f"{cfg.num_heads} heads, {cfg.num_kv_heads} KV heads, head dim {cfg.head_dim}, "
        f"intermediate {cfg.intermediate_size}, vocab {cfg.vocab_size}, "
        f"{'tied' if cfg.tie_word_embeddings else 'untied'} embeddings"
    )
