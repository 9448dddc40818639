"""OpenAI chat parameters through a live gateway with the official ``openai`` client: logprobs
(checked against transformers on the same weights), n choices sharing the prompt's KV blocks,
seed, stop, max_completion_tokens, penalties, logit bias, user, and the refusals."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
import torch

from engine.api import DEFAULT_OPTIONS, GenerateOptions
from gateway.chat.response_models import ChatCompletion, ChatCompletionChunk
from tests.gateway.harness import (
    LiveGateway,
    TenantHandle,
    gateway_on_fresh_database,
    wait_for,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

USER = [{"role": "user", "content": "Tell me about the weather in Lisbon in spring."}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    template_database: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveGateway]:
    var_dir = tmp_path_factory.mktemp("params")
    async with gateway_on_fresh_database(template_database, demo_model_dir, var_dir) as live:
        yield live


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tenant(gw: LiveGateway) -> TenantHandle:
    return await gw.create_tenant("params")  # no system prompt: the whole prompt is the user's


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(gw: LiveGateway, tenant: TenantHandle) -> openai.AsyncOpenAI:
    return gw.openai(tenant.key)


class Recorder:
    """Wraps the engine's ``generate``: the prompt ids and generated ids of each request."""

    def __init__(self, engine: Any) -> None:
        self.calls: list[tuple[list[int], list[int]]] = []
        self.outputs: list[int] = []  # outputs each request received
        self.interim: list[bool] = []  # whether each request asked for interim outputs
        self._generate = engine.generate

    async def generate(
        self, token_ids: Sequence[int], params: Any, options: GenerateOptions = DEFAULT_OPTIONS
    ) -> AsyncIterator:
        out: list[int] = []
        self.calls.append((list(token_ids), out))
        self.interim.append(options.interim)
        self.outputs.append(0)
        async for item in self._generate(token_ids, params, options):
            self.outputs[-1] += 1
            out += item.new_token_ids
            yield item


@pytest.fixture
def recorder(gw: LiveGateway, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder(gw.state.engine)
    monkeypatch.setattr(gw.state.engine, "generate", rec.generate)
    return rec


def _create(gw: LiveGateway, client: openai.AsyncOpenAI, **kw: Any) -> Any:
    args: dict[str, Any] = {"model": gw.state.model_name, "messages": USER, "max_tokens": 6}
    return client.chat.completions.create(**{**args, **kw})


async def test_greedy_logprobs_match_transformers(
    gw: LiveGateway, client: openai.AsyncOpenAI, recorder: Recorder, demo_model_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    resp = await _create(gw, client, temperature=0, logprobs=True, top_logprobs=5, max_tokens=5)
    (prompt, generated) = recorder.calls[0]
    content = resp.choices[0].logprobs.content
    assert len(content) == len(generated) == resp.usage.completion_tokens
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, torch_dtype=torch.float32)
    ids = list(prompt)
    tok = gw.state.tokenizer
    for token_id, entry in zip(generated, content, strict=True):
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
        assert token_id == int(lp.argmax())
        assert abs(entry.logprob - float(lp[token_id])) < 1e-4
        top = torch.topk(lp, 5)
        got = [t.logprob for t in entry.top_logprobs]
        assert max(abs(a - float(b)) for a, b in zip(got, top.values, strict=True)) < 1e-4
        assert entry.top_logprobs[0].token == entry.token
        assert bytes(entry.bytes) == tok.decode([token_id]).encode() or "\ufffd" in tok.decode(
            [token_id]
        )
        ids.append(token_id)
    text = resp.choices[0].message.content
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == text

    stream = await _create(
        gw, client, temperature=0, logprobs=True, top_logprobs=5, max_tokens=5, stream=True
    )
    streamed = [e async for c in stream if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]  # fmt: skip
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]


async def test_n_choices_share_the_prompt_and_follow_their_seeds(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    long_user = [{"role": "user", "content": "spring weather in Lisbon and Porto " * 12}]
    engine = gw.state.engine
    before = engine.num_model_tokens
    resp = await _create(gw, client, messages=long_user, n=4, seed=10, temperature=1.0)
    computed = engine.num_model_tokens - before
    n_prompt = resp.usage.prompt_tokens
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert 4 <= resp.usage.completion_tokens <= 4 * 6  # summed over the choices
    # Prompt counted once; its blocks computed once (each choice recomputes at most its last,
    # partial block), not four times.
    assert computed < n_prompt + 4 * (16 + 6)
    assert n_prompt > 4 * 16
    for c in resp.choices:  # choice i samples with seed + i
        alone = await _create(gw, client, messages=long_user, seed=10 + c.index, temperature=1.0)
        assert alone.choices[0].message.content == c.message.content
    assert len({c.message.content for c in resp.choices}) > 1

    stream = await _create(gw, client, messages=long_user, n=4, seed=10, stream=True)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    async for chunk in stream:
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert texts == {c.index: c.message.content for c in resp.choices}
    assert set(finishes) == {0, 1, 2, 3}


async def test_seed_reproduces_and_stop_cuts(gw: LiveGateway, client: openai.AsyncOpenAI) -> None:
    a = await _create(gw, client, seed=3, temperature=1.0, max_tokens=12)
    b = await _create(gw, client, seed=3, temperature=1.0, max_tokens=12)
    assert a.choices[0].message.content == b.choices[0].message.content
    text = a.choices[0].message.content
    cut = text[len(text) // 2 :][:3]
    assert cut.strip()
    stopped = await _create(gw, client, seed=3, temperature=1.0, max_tokens=12, stop=[cut, "@@"])
    assert stopped.choices[0].message.content == text[: text.index(cut)]
    assert stopped.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as info:
        await _create(gw, client, stop=["a", "b", "c", "d", "e"])
    assert info.value.body["param"] == "stop"  # type: ignore[index]


async def test_max_completion_tokens(gw: LiveGateway, client: openai.AsyncOpenAI) -> None:
    resp = await _create(gw, client, max_tokens=None, max_completion_tokens=3, temperature=0)
    assert resp.usage.completion_tokens <= 3 and resp.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as info:
        await _create(gw, client, max_tokens=2, max_completion_tokens=3)
    assert info.value.body["param"] == "max_completion_tokens"  # type: ignore[index]


def _penalized_choice(entry: Any, earlier: list[str], bias: dict[str, float], pen: Any) -> str:
    """The greedy pick after bias and penalties, redone on the raw top logprobs (the logprobs
    an answer reports are the model's, before any processing)."""
    presence, frequency = pen

    def score(t: Any) -> float:
        count = earlier.count(t.token)
        return t.logprob + bias.get(t.token, 0.0) - presence * (count > 0) - frequency * count

    return max(entry.top_logprobs, key=score).token


@pytest.mark.parametrize("pen", [(2.0, 0.0), (0.0, 1.5)])
async def test_penalties_follow_the_raw_logprobs(
    gw: LiveGateway, client: openai.AsyncOpenAI, recorder: Recorder, pen: tuple[float, float]
) -> None:
    first = await _create(gw, client, temperature=0, max_tokens=1, logprobs=True)
    fav, fav_id = first.choices[0].logprobs.content[0].token, recorder.calls[0][1][0]
    # A bias makes the first token a favourite at every step; the penalty has to fight it.
    resp = await _create(
        gw,
        client,
        temperature=0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=20,
        presence_penalty=pen[0],
        frequency_penalty=pen[1],
        logit_bias={str(fav_id): 1.0},
    )
    content = resp.choices[0].logprobs.content
    tokens = [e.token for e in content]
    for j, entry in enumerate(content):
        assert entry.token == _penalized_choice(entry, tokens[:j], {fav: 1.0}, pen)
    assert 0 < tokens.count(fav) < len(tokens)  # the bias won once, the penalty later


async def test_logit_bias_forces_and_bans(
    gw: LiveGateway, client: openai.AsyncOpenAI, recorder: Recorder
) -> None:
    tok = gw.state.tokenizer
    target = tok.encode(" sunny")[0]
    resp = await _create(gw, client, temperature=1.0, logit_bias={str(target): 100}, seed=1)
    assert resp.choices[0].message.content == tok.decode([target] * 6)
    greedy = await _create(gw, client, temperature=0, max_tokens=1)
    best = recorder.calls[-1][1][0]
    banned = await _create(gw, client, temperature=0, max_tokens=1, logit_bias={str(best): -100})
    assert recorder.calls[-1][1][0] != best
    assert banned.choices[0].message.content != greedy.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as info:
        await _create(gw, client, logit_bias={str(tok.vocab_size + 5): 1})
    assert info.value.body["param"] == "logit_bias"  # type: ignore[index]


async def test_user_is_recorded(
    gw: LiveGateway, client: openai.AsyncOpenAI, capfd: pytest.CaptureFixture[str]
) -> None:
    resp = await _create(gw, client, user="visitor-42", max_tokens=1)
    assert resp.usage.completion_tokens == 1
    out: list[str] = []

    def logged() -> bool:  # the log line is written once the answer is out
        out.extend(capfd.readouterr().out.splitlines())
        return any("chat_request" in ln and "visitor-42" in ln for ln in out)

    await wait_for(logged, timeout=2.0)


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "grammar"}}, "response_format.type"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"extra_body": {"best_of": 2}}, "best_of"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}
                        ],
                    }
                ]
            },
            "messages[0].content[0]",
        ),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"n": 200}, "n"),
    ],
)
async def test_refusals_through_the_client(
    gw: LiveGateway, client: openai.AsyncOpenAI, kw: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await _create(gw, client, **kw)
    assert info.value.body["param"] == param  # type: ignore[index]
    assert info.value.status_code == 400


async def test_answers_match_the_response_models(gw: LiveGateway, tenant: TenantHandle) -> None:
    body = {
        "model": gw.state.model_name,
        "messages": USER,
        "max_tokens": 4,
        "n": 2,
        "seed": 1,
        "logprobs": True,
        "top_logprobs": 2,
    }
    headers = {"Authorization": f"Bearer {tenant.key}"}
    url = f"{gw.base_url}/v1/chat/completions"
    async with gw.http.post(url, json=body, headers=headers) as resp:
        answer = ChatCompletion.model_validate(await resp.json())
    assert [c.index for c in answer.choices] == [0, 1]
    assert all(c.logprobs and len(c.logprobs.content or []) > 0 for c in answer.choices)
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with gw.http.post(url, json=stream_body, headers=headers) as resp:
        raw = (await resp.read()).decode()
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(e) for e in events[:-1]]
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        answer.usage.prompt_tokens,
        answer.usage.completion_tokens,
    )
    for i in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason is not None
        streamed = [e for c in mine if c.logprobs for e in c.logprobs.content or []]
        assert streamed == answer.choices[i].logprobs.content  # type: ignore[union-attr]


async def test_disconnect_aborts_every_choice(
    gw: LiveGateway, client: openai.AsyncOpenAI, tenant: TenantHandle
) -> None:
    stream = await _create(gw, client, n=3, max_tokens=1000, temperature=1.0, stream=True)
    got = 0
    async for _chunk in stream:
        got += 1
        if got == 8:
            break
    assert gw.state.engine.cache_stats().blocks_in_use > 0
    await stream.close()  # the client goes away: all three engine requests end now
    # (3 x 1000 tokens would take seconds)
    await wait_for(lambda: gw.state.engine.cache_stats().blocks_in_use == 0, timeout=1.0)
    await wait_for(lambda: gw.state.limiter.active_leases(tenant.id) == 0, timeout=1.0)


async def test_a_non_streaming_answer_skips_interim_outputs_unless_stops_need_them(
    gw: LiveGateway, client: openai.AsyncOpenAI, recorder: Recorder
) -> None:
    plain = await _create(gw, client, temperature=0, max_tokens=8)
    streamed = await _create(gw, client, temperature=0, max_tokens=8, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
    await _create(gw, client, temperature=0, max_tokens=8, stop=["zzz-never"])
    assert recorder.interim == [False, True, True]
    assert recorder.outputs == [2, 8, 8]  # the first and the final output only, when skipped
    assert plain.choices[0].message.content == text
    assert plain.usage.completion_tokens == 8 and plain.choices[0].finish_reason == "length"
