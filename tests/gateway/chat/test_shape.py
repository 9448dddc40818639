"""Collection sizes are refused before validation builds any of the body (gateway/chat/shape.py).

Each oversized body below also holds an invalid message: validation would report that one, so
the size refusal proves the count came first."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.chat.bounds import MAX_CONTENT_PARTS, MAX_LOGIT_BIAS, MAX_MESSAGES, MAX_TOOL_CALLS
from gateway.chat.schemas import parse_chat_request
from gateway.errors import ApiError

INVALID = {"role": "bogus", "content": "x"}  # validation would refuse this first
USER = {"role": "user", "content": "x"}


def _refusal(body: dict[str, Any], max_messages: int = MAX_MESSAGES) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_chat_request(json.dumps({"model": "m", **body}).encode(), max_messages)
    assert info.value.status == 400
    return info.value


def _call(i: int) -> dict[str, Any]:
    return {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_too_many_messages_before_any_is_validated() -> None:
    err = _refusal({"messages": [INVALID] + [USER] * MAX_MESSAGES})
    assert (err.code, err.param) == ("too_many_messages", "messages")
    assert f"{MAX_MESSAGES + 1}; at most {MAX_MESSAGES}" in err.message


def test_the_message_cap_is_the_models() -> None:
    err = _refusal({"messages": [INVALID] + [USER] * 10}, max_messages=8)
    assert err.code == "too_many_messages" and "at most 8 are accepted" in err.message
    parse_chat_request(json.dumps({"model": "m", "messages": [USER] * 8}).encode(), 8)


def test_content_parts_and_tool_calls_are_counted_in_all_messages() -> None:
    half = MAX_CONTENT_PARTS // 2 + 1
    parts = {"role": "user", "content": [{"type": "text", "text": "x"}] * half}
    err = _refusal({"messages": [INVALID, parts, parts]})
    assert (err.code, err.param) == ("too_many_content_parts", "messages")
    assert f"{2 * half} in all messages" in err.message
    calls = {"role": "assistant", "content": None, "tool_calls": [_call(i) for i in range(half)]}
    err = _refusal({"messages": [INVALID, calls, calls]})
    assert err.code == "too_many_tool_calls"
    assert f"at most {MAX_TOOL_CALLS} are accepted" in err.message


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("logit_bias", {str(t): 1 for t in range(MAX_LOGIT_BIAS + 1)}, "at most 300 entries"),
        ("stop", ["s"] * 5, "at most 4 stop sequences"),
        ("metadata", {f"k{i}": "v" for i in range(17)}, "at most 16 entries"),
        ("tools", [{"type": "function", "function": {"name": "f"}}] * 129, "at most 128 tools"),
        ("functions", [{"name": "f"}] * 129, "at most 128 functions"),
    ],
)
def test_bounded_fields_are_counted_first(field: str, value: Any, words: str) -> None:
    err = _refusal({"messages": [INVALID], field: value})
    assert err.param == field
    assert f"invalid value for {field}: {words} are allowed, got {len(value)}" == err.message


def test_the_same_message_as_validation_for_the_bounds_it_also_checks() -> None:
    bias = {str(t): 1 for t in range(MAX_LOGIT_BIAS + 1)}
    shaped = _refusal({"messages": [USER], "logit_bias": bias})
    stops = _refusal({"messages": [USER], "stop": ["a", "b", "c", "d", "e"]})
    assert shaped.message.endswith(f"at most {MAX_LOGIT_BIAS} entries are allowed, got 301")
    assert stops.message == "invalid value for stop: at most 4 stop sequences are allowed, got 5"


def test_an_unknown_field_is_refused_before_its_value_is_read() -> None:
    err = _refusal({"messages": [INVALID], "junk": list(range(50_000))})
    assert (err.code, err.param) == ("unknown_parameter", "junk")
    assert err.message == "Unrecognized request argument supplied: junk"


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b'"text"', b"{'single': 1}"])
def test_what_is_not_a_json_object_gets_validations_words(raw: bytes) -> None:
    with pytest.raises(ApiError) as info:
        parse_chat_request(raw)
    assert info.value.status == 400
    assert "JSON" in info.value.message
