"""The decoder with its paged-KV ops on the Triton kernels gives the torch path's logits.

Fused RMSNorm + residual, fused RoPE + KV store, and the attention kernels (extend after a cached
prefix, a fresh prompt, batched decode) run together, as on a GPU. On CUDA the model runs there;
on the CPU the dispatch point routes the CPU tensors to the kernels, run by Triton's interpreter.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import engine.runtime.kernels
from engine.config import EngineConfig
from engine.runtime.model.config import parse_config
from engine.runtime.model.kv_memory import block_bytes
from engine.runtime.runner import ModelRunner
from tests.engine.model.factories import blocks, logits_of, make_hf_model, random_prompt, seq
from tests.kernels.conftest import HAS_CUDA

BLOCK = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("triton-decoder")
    make_hf_model(path, arch="qwen2", hidden=64, heads=4, kv_heads=2, intermediate=96)
    return path


def _runner(path: Path, device: str) -> ModelRunner:
    per_block = block_bytes(parse_config(path), BLOCK, torch.float32)
    config = EngineConfig(block_size=BLOCK, kv_cache_bytes=64 * per_block, device=device)
    return ModelRunner.from_pretrained(path, config)


def _steps(runner: ModelRunner) -> list[torch.Tensor]:
    """Three steps: a prefix; a request after it + a fresh one; a decode step of both."""
    shared, tail, fresh = random_prompt(9, seed=1), random_prompt(5, seed=2), random_prompt(7, 3)
    a_table, b_table = blocks(0, 20, BLOCK), blocks(8, 20, BLOCK)
    out = [logits_of(runner, seq("a", shared, 0, a_table))]
    out.append(logits_of(runner, seq("a", tail, 9, a_table), seq("b", fresh, 0, b_table)))
    out.append(logits_of(runner, seq("a", [5], 14, a_table, num_generated=1),
                         seq("b", [6], 7, b_table, num_generated=1)))  # fmt: skip
    return [x.float().cpu() for x in out]


def test_triton_ops_give_the_reference_logits(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _steps(_runner(model_dir, "cpu"))
    if HAS_CUDA:
        got = _steps(_runner(model_dir, "cuda"))
    else:
        routed: list[str] = []

        def on_triton(t: torch.Tensor) -> bool:
            routed.append(str(t.device))
            return True

        monkeypatch.setattr(engine.runtime.kernels, "_on_triton", on_triton)
        got = _steps(_runner(model_dir, "cpu"))
        # 2 layers x (2 norms, rope + store, attention) per step, 3 steps, + the final norms
        assert len(routed) >= 3 * 2 * 4
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape
        assert torch.allclose(g, w, atol=1e-4, rtol=1e-4), (step, (g - w).abs().max().item())
