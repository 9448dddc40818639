"""A tiny random Qwen2 model (hidden 64, 2 layers) written once per test session.

Projection weights are scaled up (std 0.16 instead of 0.02) so attention and MLP shape the
output: greedy continuations vary with the context instead of repeating one token, and a wrong
K/V read changes them.
"""

from __future__ import annotations

import functools
import random
import tempfile
from pathlib import Path

import torch

from engine import Engine
from engine.params import SamplingParams
from engine.runtime.model.demo import (
    TOKENIZER_VOCAB,
    qwen2_config,
    random_state_dict,
    write_model_dir,
)

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
HEAD_DIM = 16
NUM_LAYERS = 2
NUM_KV_HEADS = 2


@functools.cache
def tiny_model_dir() -> Path:
    cfg = qwen2_config(
        hidden=64,
        layers=NUM_LAYERS,
        heads=4,
        kv_heads=NUM_KV_HEADS,
        intermediate=128,
        vocab=TOKENIZER_VOCAB,
        max_pos=1024,
    )
    sd = random_state_dict(cfg, seed=1234, dtype=torch.float32)
    for name in sd:
        if name.endswith("proj.weight"):
            sd[name] *= 8.0
    # Kept alive by this cache; the directory is removed when the test process exits.
    tmp = tempfile.TemporaryDirectory(prefix="kvgate-tiny-")
    _KEEP.append(tmp)
    return write_model_dir(Path(tmp.name), cfg, sd)


_KEEP: list[tempfile.TemporaryDirectory[str]] = []


def kv_bytes(num_blocks: int, block_size: int) -> int:
    """kv_cache_bytes giving exactly ``num_blocks`` blocks of the tiny model (float32)."""
    return num_blocks * 2 * NUM_LAYERS * block_size * NUM_KV_HEADS * HEAD_DIM * 4


def prompt(seed: int, n: int = 150) -> list[int]:
    """``n`` reproducible random token ids (none of the special ids 0..2)."""
    rng = random.Random(seed)
    return [rng.randrange(3, 2000) for _ in range(n)]


def first_logits(eng: Engine, ids: list[int], namespace: str) -> tuple[torch.Tensor, list[int]]:
    """Logits of the first sampled token (one scheduled step), then the greedy tokens."""
    core = eng.core
    rid = eng.add_request(ids, GREEDY, namespace=namespace)
    batch = core.scheduler.schedule()
    core.flush_transfers()
    _, logits = core.runner.compute_logits(batch)
    outs = core.scheduler.update(batch, core.runner.execute(batch))
    while not any(o.finished and o.request_id == rid for o in outs):
        outs = eng.step()
    done = next(o for o in outs if o.request_id == rid)
    return logits[0], list(done.token_ids)
