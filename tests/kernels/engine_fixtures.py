"""A CPU runner whose paged-KV ops run as Triton kernels (interpreted on the CPU), the way a GPU
runner runs them; optionally with the GPU's tile shapes and SM count, so kernel *variants* are
the ones an H200 would compile."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
import torch

import engine.runtime.kernels
from engine.config import EngineConfig
from engine.runtime.kernels.triton import decode, prefill
from engine.runtime.model.config import parse_config
from engine.runtime.model.demo import (
    TOKENIZER_VOCAB,
    qwen2_config,
    random_state_dict,
    write_model_dir,
)
from engine.runtime.model.kv_memory import block_bytes
from engine.runtime.runner import ModelRunner
from tests.kernels.conftest import HAS_CUDA

H200_SMS = 132
MAX_MODEL_LEN = 512
_KEEP: list[tempfile.TemporaryDirectory[str]] = []


@functools.cache
def one_layer_model() -> Path:
    """Qwen2 geometry in miniature: 1 layer, hidden 64, 4 heads, 2 KV heads (head dim 16)."""
    cfg = qwen2_config(
        hidden=64, layers=1, heads=4, kv_heads=2, intermediate=128, vocab=TOKENIZER_VOCAB,
        max_pos=MAX_MODEL_LEN,
    )  # fmt: skip
    tmp = tempfile.TemporaryDirectory(prefix="kvgate-1layer-")
    _KEEP.append(tmp)
    return write_model_dir(Path(tmp.name), cfg, random_state_dict(cfg, 5, torch.float32))


def route_to_triton(monkeypatch: pytest.MonkeyPatch, *, gpu_tiles: bool = False) -> None:
    if not HAS_CUDA:
        monkeypatch.setattr(engine.runtime.kernels, "_on_triton", lambda t: True)
    if gpu_tiles:
        for module in (decode, prefill):
            monkeypatch.setattr(module, "interpreting", lambda: False)  # tile choice only
        monkeypatch.setattr(decode, "num_sms", lambda device: H200_SMS)


def triton_runner(num_blocks: int = 200, block_size: int = 16, **config: object) -> ModelRunner:
    """The one-layer model in float32 with ``num_blocks`` KV blocks."""
    device = "cuda" if HAS_CUDA else "cpu"
    per_block = block_bytes(parse_config(one_layer_model()), block_size, torch.float32)
    cfg = EngineConfig(
        device=device, block_size=block_size, kv_cache_bytes=num_blocks * per_block,
        dtype="float32", cuda_graphs=False, **config,  # type: ignore[arg-type]
    )  # fmt: skip
    runner = ModelRunner.from_pretrained(one_layer_model(), cfg)
    assert runner.kv_caches[0][0].dtype == torch.float32
    return runner
