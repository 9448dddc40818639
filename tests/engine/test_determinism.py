"""What the CPU path computes bitwise the same, and what only within a tolerance
(docs/contracts.md, "Determinism").

The model is sized so that the step's matmuls are split across the GEMM's thread pool (the LM head
of one decode row: 256 x 20,000 multiply-adds, above ``gemm._MIN_SPLIT_MACS``) and SDPA splits
the keys of a decode query across threads; the tests run with 3 torch threads whatever the
machine has, so those splits happen on a 1-core machine too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.runtime.kernels.cpu import gemm
from engine.runtime.model.demo import qwen2_config, random_state_dict, write_model_dir
from tests.engine._logits import (
    LOGITS_ATOL,
    PROMPT,
    STEPS,
    fresh_engine,
    generate_with_logits,
    greedy,
)

THREADS = 3
ROOT = Path(__file__).resolve().parents[2]
HIDDEN, VOCAB = 256, 20_000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = qwen2_config(
        hidden=HIDDEN, layers=2, heads=4, kv_heads=2, intermediate=512, vocab=VOCAB, max_pos=1024
    )
    sd = random_state_dict(cfg, seed=7, dtype=torch.float32)
    for name in sd:
        if name.endswith("proj.weight"):
            sd[name] *= 6.0  # attention and MLP shape the logits (std 0.02 barely would)
    return write_model_dir(tmp_path_factory.mktemp("determinism"), cfg, sd)


@pytest.fixture(autouse=True)
def three_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(before)


def _alone(engine, prompt=PROMPT) -> tuple[list[int], torch.Tensor]:  # type: ignore[no-untyped-def]
    ((out, logits),) = generate_with_logits(engine, [prompt], greedy())
    return list(out.token_ids), logits


def test_the_model_splits_its_matmuls_across_threads() -> None:
    """Guards the premise of this module: a decode row's LM head is split across threads."""
    assert HIDDEN * VOCAB >= gemm._MIN_SPLIT_MACS


def test_a_request_alone_gives_bitwise_identical_logits_run_to_run(
    model_dir: Path, tmp_path: Path
) -> None:
    engine = fresh_engine(model_dir)
    tokens, logits = _alone(engine)
    assert logits.shape == (STEPS, VOCAB)
    again = _alone(engine)  # same engine, same (empty) cache state
    other = _alone(fresh_engine(model_dir))  # another engine: fresh buffers and pool
    out = tmp_path / "run.pt"
    subprocess.run(
        [sys.executable, "-m", "tests.engine._logits", str(model_dir), str(out), str(THREADS)],
        cwd=ROOT, check=True, timeout=300, env=os.environ.copy(),
    )  # fmt: skip
    process = torch.load(out)
    for name, (t, x) in {"again": again, "other engine": other}.items():
        assert t == tokens, name
        assert torch.equal(x, logits), f"{name}: max diff {(x - logits).abs().max().item():.3g}"
    assert process["tokens"] == tokens
    assert torch.equal(process["logits"], logits), "another process computed other logits"


def test_a_cached_prefix_repeats_bitwise_and_matches_a_full_prefill_within_tolerance(
    model_dir: Path,
) -> None:
    engine = fresh_engine(model_dir, reuse=True)
    cold_tokens, cold = _alone(engine)
    hit_tokens, hit = _alone(engine)  # the prompt's full blocks come from the cache
    again_tokens, again = _alone(engine)
    assert hit_tokens == again_tokens == cold_tokens
    assert torch.equal(again, hit)  # the same cache state: the same bits
    torch.testing.assert_close(hit, cold, rtol=0, atol=LOGITS_ATOL)


def test_a_request_in_a_batch_matches_alone_within_tolerance(model_dir: Path) -> None:
    """Not bitwise: decode-only steps attend over the batch at once (padded), and torch's
    elementwise kernels (SiLU's exp) take their vector or scalar path per element depending on
    where the thread partition of the step's tensor cuts, which moves with the batch."""
    engine = fresh_engine(model_dir)
    tokens, alone = _alone(engine)
    others = [PROMPT[:40], PROMPT[100:177]]
    for batch in ([others[0], PROMPT, others[1]], [PROMPT, others[0]]):
        results = generate_with_logits(engine, batch, greedy())
        out, logits = results[batch.index(PROMPT)]
        assert list(out.token_ids) == tokens
        torch.testing.assert_close(logits, alone, rtol=0, atol=LOGITS_ATOL)
