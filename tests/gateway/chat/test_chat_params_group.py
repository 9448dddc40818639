"""``ChoiceGroup`` over a scripted engine: n requests, seeds, merged pieces, combined stats."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from pathlib import Path

import pytest

from engine.api import DEFAULT_OPTIONS as DEFAULT
from engine.api import GenerateOptions
from engine.core.kv import CacheScope
from engine.outputs import RequestMetrics, RequestOutput, TokenLogprob
from engine.params import SamplingParams
from engine.text.tokenizer import Tokenizer
from gateway.chat.generation import ChoiceGroup
from tests.fake_engine import FakeEngine


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(demo_model_dir)


class _Engine(FakeEngine):
    """Each request streams the tokens of ``texts[seed]`` one per output, with logprobs, and
    ends with EOS (finish "stop")."""

    def __init__(self, tok: Tokenizer, texts: dict[int, str]) -> None:
        self.tok = tok
        self.texts = texts
        self.calls: list[tuple[str, str, SamplingParams]] = []
        self.scopes: list[CacheScope | None] = []
        self.closed: list[str] = []

    async def generate(
        self, ids: Sequence[int], params: SamplingParams, options: GenerateOptions = DEFAULT
    ) -> AsyncGenerator[RequestOutput, None]:
        request_id = options.request_id or "unnamed"
        self.calls.append((request_id, options.namespace, params))
        self.scopes.append(options.cache_scope)
        tokens = [*self.tok.encode(self.texts[params.seed or 0]), self.tok.eos_token_ids[0]]
        done: list[int] = []
        try:
            for i, t in enumerate(tokens):
                done.append(t)
                last = i == len(tokens) - 1
                yield RequestOutput(
                    request_id=request_id,
                    num_prompt_tokens=len(ids),
                    token_ids=tuple(done),
                    new_token_ids=(t,),
                    num_cached_tokens=3 if request_id.endswith("-1") else 0,
                    finished=last,
                    finish_reason="stop" if last else None,
                    metrics=RequestMetrics(arrival_time=0.0),
                    new_logprobs=(TokenLogprob(t, -0.5),),
                )
        finally:
            self.closed.append(request_id)


async def test_choices_run_with_their_seeds_and_combine(tokenizer: Tokenizer) -> None:
    engine = _Engine(tokenizer, {5: "hello world", 6: "good morning", 7: "hi"})
    params = SamplingParams(max_tokens=20, seed=5, logprobs=0)
    visitor = CacheScope(b"visitor-digest", 4)
    group = ChoiceGroup(
        engine,
        tokenizer,
        [1, 2, 3, 4],
        params,
        GenerateOptions("ns", "r", cache_scope=visitor),
        n=3,
    )
    await group.start()
    assert [(rid, ns, p.seed) for rid, ns, p in engine.calls] == [
        ("r", "ns", 5),
        ("r-1", "ns", 6),
        ("r-2", "ns", 7),
    ]
    assert engine.scopes == [visitor] * 3  # every choice in the end user's cache scope
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    logprobs: dict[int, int] = {}
    async for piece in group.pieces():
        texts[piece.index] = texts.get(piece.index, "") + piece.text
        logprobs[piece.index] = logprobs.get(piece.index, 0) + len(piece.logprobs)
        if piece.finish_reason:
            finishes[piece.index] = piece.finish_reason
    assert texts == {0: "hello world", 1: "good morning", 2: "hi"}
    assert finishes == {0: "stop", 1: "stop", 2: "stop"}
    # one entry per answer token: the EOS that ended each request is not part of the answer
    assert logprobs == {i: len(tokenizer.encode(t)) for i, t in texts.items()}
    s = group.stats
    assert s.prompt_tokens == 4  # once, not three times
    assert s.completion_tokens == sum(len(tokenizer.encode(t)) + 1 for t in texts.values())
    assert s.cached_tokens == 0 and s.finish_reason == "stop"  # choice 0's
    assert sorted(engine.closed) == ["r", "r-1", "r-2"]


@pytest.mark.parametrize("n", [1, 2])
async def test_stop_string_finish_reaches_the_combined_stats(tokenizer: Tokenizer, n: int) -> None:
    engine = _Engine(tokenizer, {1: "hello world again", 2: "hello there"})
    params = SamplingParams(max_tokens=20, seed=1)
    group = ChoiceGroup(
        engine, tokenizer, [1], params, GenerateOptions("ns", "q"), n=n, stops=["wor"]
    )
    await group.start()
    results = await group.results()
    want = [("hello ", "stop", None), ("hello there", "stop", None)][:n]
    assert [(r.text, r.finish_reason, r.logprobs) for r in results] == want
    assert group.stats.finish_reason == "stop"  # not the internal "stop_string"


async def test_leaving_the_stream_early_closes_every_choice(tokenizer: Tokenizer) -> None:
    engine = _Engine(tokenizer, {0: "a b c d e f g h", 1: "i j k l m n o p"})
    group = ChoiceGroup(
        engine, tokenizer, [1], SamplingParams(seed=0), GenerateOptions("ns", "z"), n=2
    )
    await group.start()
    pieces = group.pieces()
    await anext(pieces)
    await pieces.aclose()
    await group.close()
    assert sorted(engine.closed) == ["z", "z-1"]


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_stream_keeps_no_logprobs_once_sent(tokenizer: Tokenizer, streamed: bool) -> None:
    """Streamed: each entry travels with its piece and is dropped; non-streamed: all are kept
    for the answer."""
    engine = _Engine(tokenizer, {3: "hello world", 4: "good morning"})
    params = SamplingParams(max_tokens=20, seed=3, logprobs=0)
    group = ChoiceGroup(
        engine, tokenizer, [1], params, GenerateOptions("ns", "s"), n=2, streamed=streamed
    )
    await group.start()
    want = {0: len(tokenizer.encode("hello world")), 1: len(tokenizer.encode("good morning"))}
    if streamed:
        sent: dict[int, int] = {}
        async for piece in group.pieces():
            sent[piece.index] = sent.get(piece.index, 0) + len(piece.logprobs)
        assert sent == want
        assert [len(c.logprobs) for c in group.choices] == [0, 0]
    else:
        results = await group.results()
        assert {r.index: len(r.logprobs or ()) for r in results} == want


async def test_group_stats_fold_every_update_exactly(tokenizer: Tokenizer) -> None:
    """The O(1) fold of each choice's update gives what summing over all choices gives."""
    engine = _Engine(tokenizer, {0: "a b c", 1: "d e f g h i", 2: "j"})
    group = ChoiceGroup(
        engine, tokenizer, [1, 2], SamplingParams(seed=0), GenerateOptions("ns", "f"), n=3
    )
    await group.start()
    async for _piece in group.pieces():
        stats = [c.stats for c in group.choices]
        s = group.stats
        assert s.completion_tokens == sum(c.completion_tokens for c in stats)
        firsts = [c.first_token_at for c in stats if c.first_token_at is not None]
        lasts = [c.last_token_at for c in stats if c.last_token_at is not None]
        assert s.first_token_at == min(firsts, default=None)
        assert s.last_token_at == max(lasts, default=None)
        first = stats[0]
        assert (s.cached_tokens, s.finish_reason) == (first.cached_tokens, first.finish_reason)
