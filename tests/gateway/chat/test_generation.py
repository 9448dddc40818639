"""Non-streaming answers detokenize once at the end; streaming ones step by step. Both must give
the same text and usage for any token sequence, cut into engine steps in any way: split UTF-8
characters, invalid bytes, special tokens and an incomplete character at the end included."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.api import DEFAULT_OPTIONS, GenerateOptions
from engine.outputs import RequestMetrics, RequestOutput
from engine.params import SamplingParams
from engine.text.tokenizer import Tokenizer
from gateway.chat.generation import Generation
from tests.fake_engine import FakeEngine

PROPERTY = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(demo_model_dir)


class _ScriptedEngine(FakeEngine):
    """Yields the given steps of token ids as AsyncEngine outputs; the last one finishes."""

    def __init__(self, steps: Sequence[Sequence[int]], finish_reason: str) -> None:
        self.steps = steps
        self.finish_reason = finish_reason

    async def generate(
        self, token_ids: Sequence[int], params: Any, options: GenerateOptions = DEFAULT_OPTIONS
    ) -> AsyncGenerator[RequestOutput, None]:
        done: list[int] = []
        for i, step in enumerate(self.steps):
            done += step
            last = i == len(self.steps) - 1
            yield RequestOutput(
                request_id="r",
                num_prompt_tokens=len(token_ids),
                token_ids=tuple(done),
                new_token_ids=tuple(step),
                num_cached_tokens=2,
                finished=last,
                finish_reason=self.finish_reason if last else None,  # type: ignore[arg-type]
                metrics=RequestMetrics(arrival_time=0.0),
            )


async def _answer(tok: Tokenizer, engine: _ScriptedEngine, stream: bool) -> tuple[str, Any]:
    params = SamplingParams(max_tokens=64)
    gen = Generation(engine, tok, [1, 2, 3], params, GenerateOptions("n", "r"))
    await gen.start()
    if stream:
        text = "".join([delta async for delta in gen.text()])
    else:
        text = await gen.full_text()
    s = gen.stats
    return text, (s.completion_tokens, s.cached_tokens, s.finish_reason)


def _steps(ids: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = sorted({c % (len(ids) + 1) for c in cuts} - {0, len(ids)})
    edges = [0, *bounds, len(ids)]
    return [ids[a:b] for a, b in pairwise(edges)]


@PROPERTY
@given(
    ids=st.lists(st.integers(min_value=0, max_value=1999), min_size=1, max_size=24),
    cuts=st.lists(st.integers(min_value=0, max_value=64), max_size=8),
    finish=st.sampled_from(["length", "stop"]),
)
async def test_full_text_equals_the_streamed_text(
    tokenizer: Tokenizer, ids: list[int], cuts: list[int], finish: str
) -> None:
    engine = _ScriptedEngine(_steps(ids, cuts), finish)
    assert await _answer(tokenizer, engine, False) == await _answer(tokenizer, engine, True)


async def test_split_characters_and_a_cut_off_end(tokenizer: Tokenizer) -> None:
    # "é" and "€" as single bytes (byte-level BPE), one byte per engine step, and an end that
    # stops inside "€": the cut-off character is dropped, never emitted as U+FFFD.
    byte_ids = [tokenizer.token_to_id(c) for c in ("Ã", "©", "â", "Ĥ", "¬", "â", "Ĥ")]
    assert None not in byte_ids
    engine = _ScriptedEngine([[i] for i in byte_ids], "length")
    text, usage = await _answer(tokenizer, engine, False)
    assert text == "é€" and usage == (7, 2, "length")
    assert (text, usage) == await _answer(tokenizer, engine, True)
