"""ModelRunner API: KV sizing, execute() contract, input validation, shared-prefix metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.core.batch import ScheduledBatch
from engine.params import SamplingParams
from engine.runtime.model.inputs import build_step_inputs, shared_prefix_blocks, slots_of
from engine.runtime.model.kv_memory import CPU_KV_CAP_BYTES, block_bytes, kv_budget_bytes
from engine.runtime.runner import ModelRunner
from tests.engine.model.factories import blocks, make_hf_model, make_runner, random_prompt, seq


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("runner")
    make_hf_model(path, arch="qwen2", std=0.3)
    return path


@pytest.fixture(scope="module")
def runner(model_dir: Path) -> ModelRunner:
    return make_runner(model_dir, block_size=4, num_blocks=64)


def test_public_attributes(runner: ModelRunner) -> None:
    assert runner.num_blocks == 64
    assert runner.max_model_len == 512
    assert runner.eos_token_ids and all(isinstance(t, int) for t in runner.eos_token_ids)
    assert runner.tokenizer.decode(runner.tokenizer.encode("hello world")) == "hello world"
    k, v = runner.kv_caches[0]
    assert k.shape == v.shape == (64, 4, 2, 16)


def test_kv_budget_sizing(model_dir: Path) -> None:
    cfg = EngineConfig(block_size=8, kv_cache_bytes=10_000_000)
    r = ModelRunner.from_pretrained(model_dir, cfg)
    assert r.num_blocks == cfg.kv_cache_bytes // block_bytes(r.model_config, 8, torch.float32)
    auto = kv_budget_bytes(EngineConfig(kv_cache_memory_fraction=1.0), torch.device("cpu"))
    assert 0 < auto <= CPU_KV_CAP_BYTES
    with pytest.raises(Exception, match="holds no block"):
        ModelRunner.from_pretrained(model_dir, EngineConfig(kv_cache_bytes=10))


def test_execute_contract(runner: ModelRunner) -> None:
    assert runner.execute(ScheduledBatch([])) == []
    a = seq("a", random_prompt(10, 1), 0, blocks(0, 10, 4), sample=False)
    b = seq("b", random_prompt(5, 2), 0, blocks(3, 5, 4))
    out = runner.execute(ScheduledBatch([a, b]))
    assert out[0] is None and isinstance(out[1], int) and 0 <= out[1] < 2000


def test_seeded_request_recomputed_after_preemption_samples_same_tokens(
    runner: ModelRunner,
) -> None:
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=8)
    prompt = random_prompt(9, 3)

    def generate(table: list[int]) -> list[int]:
        ids = list(prompt)
        token = runner.execute(ScheduledBatch([seq("s", ids, 0, table, params=params)]))[0]
        out = [token]
        for n in range(1, 6):
            ids.append(token)
            step = seq("s", [token], len(ids) - 1, table, params=params, num_generated=n)
            token = runner.execute(ScheduledBatch([step]))[0]
            out.append(token)
        return out

    first = generate(blocks(20, 16, 4))
    # Recompute elsewhere in the pool (as after preemption): the same tokens come out.
    assert generate(blocks(40, 16, 4)) == first


def test_invalid_batches_are_rejected(runner: ModelRunner) -> None:
    with pytest.raises(ValueError, match="block table has 1 blocks, 3 needed"):
        runner.execute(ScheduledBatch([seq("x", random_prompt(9, 1), 0, [0])]))
    with pytest.raises(ValueError, match=r"outside 0\.\.63"):
        runner.execute(ScheduledBatch([seq("x", [1, 2], 0, [64])]))
    with pytest.raises(ValueError, match="exceed 512"):
        runner.execute(ScheduledBatch([seq("x", [1], 512, list(range(63)) * 3)]))
    with pytest.raises(ValueError, match="no tokens"):
        runner.execute(ScheduledBatch([seq("x", [], 0, [0])]))


def test_step_inputs_layout_and_shared_blocks() -> None:
    batch = ScheduledBatch(
        [
            seq("a", [1, 2, 3], 9, [5, 6, 7, 8]),  # positions 9..11
            seq("b", [4], 10, [5, 6, 9], sample=False),  # position 10
        ]
    )
    inp = build_step_inputs(batch, 4, 16, 100, torch.device("cpu"))
    assert inp.positions.tolist() == [9, 10, 11, 10]
    assert inp.meta.slot_mapping.tolist() == [7 * 4 + 1, 7 * 4 + 2, 7 * 4 + 3, 9 * 4 + 2]
    assert inp.meta.query_start_loc.tolist() == [0, 3, 4]
    assert inp.meta.block_tables.tolist() == [[5, 6, 7], [5, 6, 9]]
    assert inp.meta.num_shared_blocks == 2
    assert inp.logits_indices.tolist() == [2] and inp.sampled_seqs == (0,)
    # Shared blocks stop at the first difference and at the shortest cached context.
    assert shared_prefix_blocks([[1, 2, 3], [1, 2, 4]], [12, 12], 4) == 2
    assert shared_prefix_blocks([[1, 2, 3], [1, 2, 3]], [12, 5], 4) == 1
    assert shared_prefix_blocks([[1, 2], [3, 2]], [8, 8], 4) == 0


@pytest.mark.parametrize(("start", "end"), [(0, 1), (3, 4), (0, 16), (2, 13), (5, 12), (7, 8)])
def test_slots_follow_the_block_table_across_block_boundaries(start: int, end: int) -> None:
    table, bs = [9, 2, 14, 5], 4
    want = [table[p // bs] * bs + p % bs for p in range(start, end)]
    assert slots_of(table, start, end, bs) == want
