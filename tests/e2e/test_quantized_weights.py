"""The real default model with its Q4_1 / Q8_0 weights kept in their blocks (the CPU default)
against the same GGUF dequantized to float32: the first step's logits within a stated tolerance,
and the same 32 greedy tokens on the test prompts. The weights are identical; only the order of
the float32 sums differs (per block of 32, then scaled: engine/runtime/kernels/cpu/qgemm.c).
``weights="blocks-int16"`` rounds every linear's input to int16 per block of 32 (q8gemm.c's
int16 build) and is held to the same tolerance and the same greedy tokens.

``weights="blocks-int8"`` rounds every linear's input to int8 per block of 32, as llama.cpp
does (q8gemm.c). Each linear then errs by 0.4-1% (relative norm, measured on this model), and
over 30 layers the first step's top-5 log-probabilities moved by up to 0.53 on the test
prompts; greedy answers agreed with the dequantized model's for 0, 32 and 12 tokens (the first
prompt's top two tokens are 0.02 apart). Which inputs round up is a draw: a one-ulp change in
SiLU's exp moved the worst of those log-probabilities from 0.46 to 0.53 (earlier trees: 0.28),
so its tolerance, stated below, is the path's documented cost with room for that draw; the
default keeps float32 activations."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.outputs import TokenLogprob
from engine.params import SamplingParams
from engine.runtime.kernels.cpu import qgemm
from engine.runtime.model.blocks import BlockWeight
from engine.serving.engine import Engine

PROMPTS = (
    "My rocket order 4711 has not arrived",
    "How do I return a launch kit I have not opened?",
    "Write one sentence about the moon.",
)
TOKENS = 32
TOP = 5
LOGPROB_TOLERANCE = 2e-3  # of each of the first step's top-5 log-probabilities
INT8_TOP = 20  # blocks-int8: the dequantized model's top 5 are among its top 20 ...
INT8_LOGPROB_TOLERANCE = 1.0  # ... each within this of its log-probability (0.28-0.53 measured)


def _engine(gguf: Path, weights: str) -> Engine:
    return Engine.from_pretrained(gguf, device="cpu", kv_cache_bytes=32 << 20, weights=weights)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("weights", "kind"), [("auto", qgemm.Q4_1), ("blocks-int16", qgemm.Q4_1_INT16)]
)
def test_block_weights_agree_with_the_dequantized_model(
    default_gguf: Path, weights: str, kind: str
) -> None:
    if qgemm.load() is None:
        pytest.skip("no block GEMM on this machine")
    blocks, plain = _engine(default_gguf, weights), _engine(default_gguf, "dequantized")
    assert isinstance(blocks.core.runner.decoder.embed, BlockWeight)
    assert {x.qkv.blocks.kind for x in blocks.core.runner.decoder.layers if x.qkv.blocks} == {kind}
    assert not isinstance(plain.core.runner.decoder.embed, BlockWeight)
    tok = blocks.tokenizer
    greedy = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    first = SamplingParams(temperature=0.0, max_tokens=1, logprobs=TOP)
    for question in PROMPTS:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": question}]))
        ours, theirs = (e.generate([ids], greedy)[0].token_ids for e in (blocks, plain))
        assert ours == theirs, (tok.decode(list(ours)), tok.decode(list(theirs)))
        mine, want = (_top(e.generate([ids], first)[0].new_logprobs) for e in (blocks, plain))
        assert [t for t, _ in mine] == [t for t, _ in want]
        diff = max(abs(a - b) for (_, a), (_, b) in zip(mine, want, strict=True))
        assert diff <= LOGPROB_TOLERANCE, (question, diff)


def _top(entries: tuple[TokenLogprob, ...] | None) -> tuple[tuple[int, float], ...]:
    assert entries is not None and len(entries) == 1
    return entries[0].top


@pytest.mark.timeout(600)
def test_int8_activations_stay_within_their_stated_tolerance(default_gguf: Path) -> None:
    if qgemm.load() is None:
        pytest.skip("no block GEMM on this machine")
    rounded, plain = _engine(default_gguf, "blocks-int8"), _engine(default_gguf, "dequantized")
    layers = rounded.core.runner.decoder.layers
    assert {x.qkv.blocks.kind for x in layers if x.qkv.blocks} == {qgemm.Q4_1_INT8}
    tok = rounded.tokenizer
    worst = 0.0
    for question in PROMPTS:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": question}]))
        got = dict(_first_step(rounded, ids, INT8_TOP))
        for token, logprob in _first_step(plain, ids, TOP):
            assert token in got, (question, token)
            worst = max(worst, abs(got[token] - logprob))
    assert 1e-3 < worst <= INT8_LOGPROB_TOLERANCE  # rounded, and within the stated cost


def _first_step(engine: Engine, ids: list[int], top: int) -> tuple[tuple[int, float], ...]:
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=top)
    return _top(engine.generate([ids], params)[0].new_logprobs)
