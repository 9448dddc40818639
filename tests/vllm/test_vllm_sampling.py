"""Sampling parameters on token-id completions against a real vLLM server: ``logprobs``,
``seed``, ``n``, ``stop``, ``logit_bias``, as the OpenAI API documents them."""

from __future__ import annotations

import math

import pytest

from tests.vllm.conftest import API_KEY
from tests.vllm.probes import client, random_ids, stream
from tests.vllm.servers import MODEL_NAME, VllmServer

PROMPT_SEED = 20260  # one fixed prompt: greedy answers repeat across runs


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return random_ids(40, seed=PROMPT_SEED)


def test_logprobs_shape_with_token_ids(vllm_server: VllmServer, prompt: list[int]) -> None:
    """``logprobs=k``: per generated token its logprob and the top k alternatives (the sampled
    one added when it is not among them); ``return_tokens_as_token_ids`` names tokens
    ``token_id:N``, so the gateway maps them to ids without re-tokenizing."""
    c = client(vllm_server, API_KEY)
    reply = c.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=5,
        temperature=0.0,
        logprobs=3,
        extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True},
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    assert lp is not None and len(lp.tokens) == len(lp.token_logprobs) == 5
    ids = [int(t.removeprefix("token_id:")) for t in lp.tokens]
    assert ids == list(choice.model_extra["token_ids"])  # type: ignore[index]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0.0 and 3 <= len(top) <= 4
        assert all(k.startswith("token_id:") for k in top)
        assert math.isclose(max(top.values()), logprob, abs_tol=1e-4)  # greedy: the best one
        assert top[token] == pytest.approx(logprob, abs=1e-4)


def test_a_seed_repeats_a_sampled_answer(vllm_server: VllmServer, prompt: list[int]) -> None:
    c = client(vllm_server, API_KEY)
    runs = [
        stream(c, prompt, max_tokens=12, temperature=1.0, seed=seed).token_ids for seed in (7, 7, 8)
    ]
    assert runs[0] == runs[1] and len(runs[0]) == 12
    assert runs[2] != runs[0]  # 12 tokens at temperature 1: equal by chance is negligible


def test_n_choices_each_with_its_own_index(vllm_server: VllmServer, prompt: list[int]) -> None:
    c = client(vllm_server, API_KEY)
    reply = c.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=1.0, seed=3, n=3
    )
    assert sorted(ch.index for ch in reply.choices) == [0, 1, 2]
    assert reply.usage is not None and reply.usage.completion_tokens == 18
    assert reply.usage.prompt_tokens == len(prompt)  # counted once, not per choice


def test_stop_string_ends_the_text_before_it(vllm_server: VllmServer, prompt: list[int]) -> None:
    c = client(vllm_server, API_KEY)
    full = stream(c, prompt, max_tokens=24)
    assert len(full.text) > 8
    cut = len(full.text) // 2
    stop = full.text[cut : cut + 3]
    stopped = stream(c, prompt, max_tokens=24, stop=[stop])
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.index(stop)]


def test_logit_bias_bans_and_forces_tokens(vllm_server: VllmServer, prompt: list[int]) -> None:
    c = client(vllm_server, API_KEY)
    greedy = stream(c, prompt, max_tokens=3).token_ids
    banned = stream(c, prompt, max_tokens=3, logit_bias={str(greedy[0]): -100}).token_ids
    assert banned[0] != greedy[0]
    forced_id = 4093  # any ordinary token
    forced = stream(c, prompt, max_tokens=3, logit_bias={str(forced_id): 100}).token_ids
    assert forced == [forced_id] * 3
