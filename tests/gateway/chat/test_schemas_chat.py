"""Chat request validation without a server: refusals name their parameter, defaults apply."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.chat.admission import sampling_params
from gateway.chat.schemas import ChatRequest, parse_chat_request
from gateway.errors import ApiError
from gateway.settings import Settings

HI = [{"role": "user", "content": "hi"}]


def _parse(**fields: Any) -> ChatRequest:
    return parse_chat_request(json.dumps({"model": "m", "messages": HI, **fields}).encode())


def _refused(**fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        _parse(**fields)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"frobnicate": 1}, "frobnicate", "Unrecognized request argument supplied: frobnicate"),
        ({"tool_choice": "auto"}, "tool_choice", "only allowed when tools are specified"),
        ({"functions": [{"name": "f"}]}, "functions", "function calling"),
        ({"function_call": "auto"}, "function_call", "function calling"),
        ({"response_format": {"type": "grammar"}}, "response_format.type", "'grammar'"),
        ({"modalities": ["text", "audio"]}, "modalities", "text"),
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio", "audio"),
        ({"reasoning_effort": "low"}, "reasoning_effort", "reasoning"),
        ({"store": True}, "store", "stored"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 stop sequences"),
        ({"stop": ["a", ""]}, "stop", "must not be empty"),
        ({"stop": ""}, "stop", "must not be empty"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens", "disagree"),
        ({"top_logprobs": 2}, "top_logprobs", "requires logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        ({"logit_bias": {"abc": 1}}, "logit_bias", "invalid key"),
        ({"logit_bias": {"-1": 1}}, "logit_bias", "invalid key"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
        ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
        ({"frequency_penalty": -3}, "frequency_penalty", "greater than or equal to -2"),
        ({"n": 0}, "n", "greater than or equal to 1"),
        ({"n": 129}, "n", "less than or equal to 128"),
    ],
)
def test_refusals_name_the_parameter(fields: dict[str, Any], param: str, words: str) -> None:
    err = _refused(**fields)
    assert err.param == param
    assert words in err.message


@pytest.mark.parametrize(
    ("part", "kind"),
    [
        ({"type": "image_url", "image_url": {"url": "https://x/y.png"}}, "image_url"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "input_audio"),
        ({"type": "file", "file": {"file_id": "f"}}, "file"),
    ],
)
def test_non_text_content_parts_are_refused(part: dict[str, Any], kind: str) -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "look"}, part]}]
    with pytest.raises(ApiError) as info:
        parse_chat_request(json.dumps({"model": "m", "messages": msgs}).encode())
    assert info.value.param == "messages[0].content[1]"
    assert f"'{kind}'" in info.value.message and "text only" in info.value.message


def test_accepted_no_op_fields_and_text_defaults() -> None:
    req = _parse(
        response_format={"type": "text"},
        modalities=["text"],
        tools=[],
        tool_choice="none",
        store=False,
        metadata={"a": "b"},
        parallel_tool_calls=True,
        service_tier="auto",
        max_tokens=7,
        max_completion_tokens=7,
        stop=["x", "y", "z", "w"],
        user="visitor-1",
    )
    assert req.requested_max_tokens == 7 and req.stop_strings == ("x", "y", "z", "w")
    assert req.user == "visitor-1"


def test_sampling_params_take_the_request_then_the_defaults() -> None:
    model = Settings.from_env(
        {
            "KVGATE_DEFAULT_TEMPERATURE": "0.7",
            "KVGATE_DEFAULT_TOP_P": "0.8",
            "KVGATE_DEFAULT_REPETITION_PENALTY": "1.1",
            "KVGATE_DEFAULT_FREQUENCY_PENALTY": "0.3",
        }
    ).model
    p = sampling_params(_parse(), 9, model, vocab_size=100)
    assert (p.temperature, p.top_p, p.repetition_penalty, p.frequency_penalty) == (
        0.7,
        0.8,
        1.1,
        0.3,
    )
    assert p.logprobs is None and p.logit_bias == () and p.max_tokens == 9
    req = _parse(
        temperature=0,
        top_p=1,
        frequency_penalty=0,
        presence_penalty=-1.5,
        logit_bias={"5": -100, "7": 2.5},
        logprobs=True,
        top_logprobs=3,
        seed=11,
    )
    p = sampling_params(req, 9, model, vocab_size=100)
    assert (p.temperature, p.top_p, p.frequency_penalty, p.presence_penalty) == (0, 1, 0, -1.5)
    assert p.logit_bias == ((5, -100.0), (7, 2.5)) and p.logprobs == 3 and p.seed == 11
    assert sampling_params(_parse(logprobs=True), 9, model, 100).logprobs == 0
    with pytest.raises(ApiError) as info:
        sampling_params(_parse(logit_bias={"100": 1}), 9, model, vocab_size=100)
    assert info.value.param == "logit_bias"


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("KVGATE_DEFAULT_TEMPERATURE", "2.5"),
        ("KVGATE_DEFAULT_TOP_P", "0"),
        ("KVGATE_DEFAULT_REPETITION_PENALTY", "0"),
        ("KVGATE_DEFAULT_FREQUENCY_PENALTY", "-2.1"),
    ],
)
def test_bad_sampling_defaults_fail_start_up(name: str, raw: str) -> None:
    with pytest.raises(ValueError, match=name):
        Settings.from_env({name: raw})
