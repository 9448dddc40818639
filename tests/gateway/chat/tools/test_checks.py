"""Tool and structured-output fields of a chat request, without a server: what is accepted,
and refusals that name their parameter."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.chat.schemas import ChatRequest, parse_chat_request
from gateway.chat.tools.models import MAX_TOOLS, NamedToolChoice
from gateway.errors import ApiError

HI = [{"role": "user", "content": "hi"}]
FN = {"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_order", "arguments": "{}"}}


def _parse(**fields: Any) -> ChatRequest:
    return parse_chat_request(json.dumps({"model": "m", "messages": HI, **fields}).encode())


def test_accepted_shapes() -> None:
    req = _parse(
        tools=[FN, {"type": "function", "function": {"name": "noargs", "strict": True}}],
        tool_choice={"type": "function", "function": {"name": "noargs"}},
        parallel_tool_calls=False,
        messages=[
            *HI,
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "ok"}]},
        ],
    )
    assert isinstance(req.tool_choice, NamedToolChoice)
    assert req.tools is not None and req.tools[1].function.parameters_schema["properties"] == {}
    assert req.messages[1].content is None and req.messages[2].text == "ok"
    fmt = _parse(response_format={"type": "json_schema", "json_schema": {"name": "o"}})
    assert fmt.response_format is not None and fmt.response_format.json_schema is not None
    for choice in ("none", "auto", "required"):
        assert _parse(tools=[FN], tool_choice=choice).tool_choice == choice
    assert _parse(tool_choice="none").tool_choice == "none"  # harmless without tools
    assert _parse(parallel_tool_calls=True).parallel_tool_calls  # as before: no effect alone


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tool_choice": "required"}, "tool_choice", "only allowed when tools"),
        ({"tools": [FN], "tool_choice": "sometimes"}, "tool_choice", "'none', 'auto'"),
        (
            {"tools": [FN], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not in tools",
        ),
        ({"tools": [FN, FN]}, "tools[1].function.name", "declared twice"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
            "pattern",
        ),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type", "'function'"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
            "an object",
        ),
        ({"tools": [FN] * (MAX_TOOLS + 1)}, "tools", f"at most {MAX_TOOLS}"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "needs"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "'xml'"),
        (
            {"tools": [FN], "response_format": {"type": "json_object"}},
            "response_format",
            "together with tools",
        ),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "content is required"),
        (
            {"messages": [*HI, {"role": "tool", "content": "x"}]},
            "messages[1].tool_call_id",
            "needs",
        ),
        (
            {"messages": [*HI, {"role": "tool", "content": "x", "tool_call_id": "call_9"}]},
            "messages[1].tool_call_id",
            "earlier assistant",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]},
            "messages[0].tool_calls",
            "only assistant",
        ),
        ({"functions": [{"name": "f"}]}, "functions", "deprecated"),
    ],
)
def test_refusals_name_the_parameter(fields: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(ApiError) as info:
        _parse(**fields)
    assert (info.value.status, info.value.param) == (400, param)
    assert words in info.value.message
