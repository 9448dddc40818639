"""Logits of kvgate's decoder equal HF transformers' on the same weights (float32, 1e-4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.model.factories import (
    blocks,
    hf_last_logits,
    logits_of,
    make_hf_model,
    make_runner,
    random_prompt,
    seq,
)

TOL = 1e-4
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

CASES = {
    "qwen2-tied-gqa": dict(arch="qwen2", tied=True),
    "qwen2-untied": dict(arch="qwen2", tied=False, kv_heads=1),
    "llama-untied-gqa": dict(arch="llama", tied=False),
    "llama-tied-mha": dict(arch="llama", tied=True, kv_heads=4),
    "llama3-rope-scaling": dict(arch="llama", rope_parameters=LLAMA3_ROPE),
    "llama-attention-bias": dict(arch="llama", attention_bias=True),
    "qwen2-sharded": dict(arch="qwen2", tied=False, max_shard_size="100KB"),
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    path: Path = tmp_path_factory.mktemp(request.param)
    _, hf = make_hf_model(path, **CASES[request.param])
    return make_runner(path, block_size=4), hf


def test_single_prompt_and_decode_steps(pair) -> None:
    runner, hf = pair
    ids = random_prompt(37, seed=1)
    table = blocks(0, len(ids) + 8, 4)
    got = logits_of(runner, seq("a", ids, 0, table))[0]
    assert (got - hf_last_logits(hf, ids)).abs().max().item() <= TOL
    # Decode steps read the cached prompt through the block table.
    for step in range(4):
        token = int(got.argmax())
        ids.append(token)
        got = logits_of(runner, seq("a", [token], len(ids) - 1, table))[0]
        assert (got - hf_last_logits(hf, ids)).abs().max().item() <= TOL, f"step {step}"


def test_batched_ragged_prompts(pair) -> None:
    runner, hf = pair
    prompts = [random_prompt(n, seed=n) for n in (1, 9, 30, 17)]
    seqs, first = [], 0
    for i, p in enumerate(prompts):
        seqs.append(seq(f"r{i}", p, 0, blocks(first, len(p), 4)))
        first += len(seqs[-1].block_table)
    got = logits_of(runner, *seqs)
    assert got.shape == (len(prompts), 2000)
    for i, p in enumerate(prompts):
        assert (got[i] - hf_last_logits(hf, p)).abs().max().item() <= TOL, f"request {i}"


def test_sharded_checkpoint_is_sharded(tmp_path: Path) -> None:
    make_hf_model(tmp_path, max_shard_size="100KB", tied=False)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
