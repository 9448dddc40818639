"""A ragged batch (prefill chunks, cached suffixes and decodes mixed) equals each request alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.core.batch import ScheduledBatch
from tests.engine.model.factories import blocks, logits_of, make_hf_model, make_runner, seq
from tests.engine.model.factories import random_prompt as prompt_of

BS = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("batching")
    make_hf_model(path, arch="llama", tied=False, std=0.3)
    return path


def _prefill_prefix(runner, ids: list[int], upto: int, table: list[int]) -> None:
    if upto:
        runner.execute(ScheduledBatch([seq("p", ids[:upto], 0, table, sample=False)]))


def test_ragged_batch_equals_each_request_alone(model_dir: Path) -> None:
    # (prompt length, tokens already cached): fresh prompts, a chunk after a cache, decodes.
    shapes = [(20, 0), (1, 0), (33, 16), (40, 39), (9, 8), (64, 17)]
    prompts = [prompt_of(n, seed=i) for i, (n, _) in enumerate(shapes)]
    batched = make_runner(model_dir, block_size=BS)
    alone = make_runner(model_dir, block_size=BS)
    seqs, first = [], 0
    for i, ((n, cached), ids) in enumerate(zip(shapes, prompts, strict=True)):
        table = blocks(first, n, BS)
        first += len(table)
        _prefill_prefix(batched, ids, cached, table)
        seqs.append(seq(f"r{i}", ids[cached:], cached, table, sample=i != 2))
    got = logits_of(batched, *seqs)
    tokens = batched.execute(ScheduledBatch(seqs))
    assert tokens[2] is None and all(t is not None for i, t in enumerate(tokens) if i != 2)
    rows = iter(range(got.shape[0]))
    for i, s in enumerate(seqs):
        _prefill_prefix(alone, prompts[i], s.start_pos, s.block_table)
        one = logits_of(alone, s)
        if not s.sample:
            assert one.shape[0] == 0
            continue
        row = next(rows)
        # Different row counts take different GEMM kernels: rounding-level differences only.
        torch.testing.assert_close(got[row], one[0], rtol=1e-5, atol=1e-5)
        assert tokens[i] == int(one[0].argmax())


def test_only_sampling_rows_reach_the_lm_head(model_dir: Path) -> None:
    runner = make_runner(model_dir, block_size=BS)
    s1 = seq("a", prompt_of(30, 1), 0, blocks(0, 30, BS), sample=False)
    s2 = seq("b", prompt_of(12, 2), 0, blocks(10, 12, BS), sample=True)
    inputs, logits = runner.compute_logits(ScheduledBatch([s1, s2]))
    assert logits.shape == (1, 2000)
    assert inputs.logits_indices.tolist() == [41]
    assert inputs.sampled_seqs == (1,)


def test_decode_only_batch_equals_each_request_alone(model_dir: Path) -> None:
    # One new token per request, different cached lengths (the batched decode path).
    lengths = [5, 17, 1, 32, 9]
    batched = make_runner(model_dir, block_size=BS)
    alone = make_runner(model_dir, block_size=BS)
    seqs, first = [], 0
    for i, n in enumerate(lengths):
        ids = prompt_of(n + 1, seed=50 + i)
        table = blocks(first, n + 1, BS)
        first += len(table)
        for r in (batched, alone):
            _prefill_prefix(r, ids, n, table)
        seqs.append(seq(f"d{i}", ids[n:], n, table))
    got = logits_of(batched, *seqs)
    for i, s in enumerate(seqs):
        torch.testing.assert_close(got[i], logits_of(alone, s)[0], rtol=1e-5, atol=1e-5)
