"""Tiny random HF models written with transformers' save_pretrained, plus batch builders."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.core.batch import ScheduledBatch, ScheduledSeq
from engine.params import SamplingParams
from engine.runtime.model.demo import write_tokenizer_files
from engine.runtime.runner import ModelRunner

GREEDY = SamplingParams(temperature=0.0, max_tokens=1000)
VOCAB = 2000


@lru_cache(maxsize=1)
def _tokenizer_files() -> dict[str, bytes]:
    """The demo tokenizer's files, trained once per test process and kept in memory."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvgate-test-tok-") as tmp:
        write_tokenizer_files(Path(tmp))
        return {name: (Path(tmp) / name).read_bytes() for name in _TOKENIZER_FILES}


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def copy_tokenizer(path: Path) -> None:
    for name, data in _tokenizer_files().items():
        (path / name).write_bytes(data)


def make_hf_model(
    path: Path,
    arch: str = "qwen2",
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    tied: bool = True,
    rope_parameters: dict[str, Any] | None = None,
    max_shard_size: str | None = None,
    seed: int = 0,
    std: float = 0.15,
    **extra: Any,
) -> tuple[Path, Any]:
    """Save a random Llama/Qwen2 model; returns (path, the HF model in eval mode).

    Every parameter is redrawn (biases included, norms near 1) so that loading mistakes show.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }[arch]
    kwargs: dict[str, Any] = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
        **extra,
    )
    if rope_parameters is not None:
        kwargs["rope_parameters"] = rope_parameters
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else std * noise)
    path.mkdir(parents=True, exist_ok=True)
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **save_kwargs)
    copy_tokenizer(path)
    return path, model


def make_runner(path: Path, block_size: int = 16, num_blocks: int = 256) -> ModelRunner:
    from engine.runtime.model.config import parse_config
    from engine.runtime.model.kv_memory import block_bytes

    per_block = block_bytes(parse_config(path), block_size, torch.float32)
    # float32 pinned: these tests hold the float32 path to transformers' (dtype=auto would be
    # bfloat16 on a CPU with bf16 units; test_bf16.py tests that path)
    config = EngineConfig(
        block_size=block_size, kv_cache_bytes=num_blocks * per_block, dtype="float32"
    )
    return ModelRunner.from_pretrained(path, config)


def seq(
    rid: str,
    tokens: Sequence[int],
    start: int,
    table: Sequence[int],
    sample: bool = True,
    params: SamplingParams = GREEDY,
    num_generated: int = 0,
) -> ScheduledSeq:
    return ScheduledSeq(rid, list(tokens), start, list(table), sample, params, num_generated)


def blocks(first: int, num_tokens: int, block_size: int) -> list[int]:
    """Consecutive block ids covering num_tokens."""
    return list(range(first, first + (num_tokens + block_size - 1) // block_size))


def logits_of(runner: ModelRunner, *seqs: ScheduledSeq) -> torch.Tensor:
    return runner.compute_logits(ScheduledBatch(list(seqs)))[1]


def hf_last_logits(model: Any, ids: Sequence[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0, -1].float()


def random_prompt(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=gen).tolist()
