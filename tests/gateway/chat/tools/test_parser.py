"""The tool-call parser: the calls and content of each family's answers, the same whether the
text arrives at once or in pieces cut anywhere, and streamed deltas that add up to the calls."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.chat.tools.formats import HERMES, LLAMA3, SMOLLM2, ToolFormat
from gateway.chat.tools.parser import ToolCallParser

WEATHER = '{"city": "Pa\\"ris}", "days": [1, {"x": "]"}], "ok": true}'

CASES = [
    # (format, answer, content, [(name, arguments)])
    (HERMES, "Just text, no call.  \n", "Just text, no call.  \n", []),
    (
        HERMES,
        f'Let me look.\n<tool_call>\n{{"name": "weather", "arguments": {WEATHER}}}\n</tool_call>',
        "Let me look.",
        [("weather", WEATHER)],
    ),
    (
        HERMES,
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"arguments": {"q": 1}, "name": "b"}\n</tool_call>',
        None,
        [("a", "{}"), ("b", '{"q": 1}')],
    ),
    (HERMES, '<tool_call>\n{"name": "noargs"}\n</tool_call>', None, [("noargs", "{}")]),
    # the tag, then prose: no call after all; the text is given back whole
    (HERMES, "write <tool_call> to call", "write <tool_call> to call", []),
    (HERMES, "ends with <tool", "ends with <tool", []),
    (
        SMOLLM2,
        '<tool_call>[{"name": "a", "arguments": {"s": "<tool_call>"}}, '
        '{"name": "b", "arguments": {"n": -1.5e3}}]</tool_call>',
        None,
        [("a", '{"s": "<tool_call>"}'), ("b", '{"n": -1.5e3}')],
    ),
    (SMOLLM2, "<tool_call>[]</tool_call>", "", []),  # SmolLM2's "no call needed"
    (
        LLAMA3,
        ' {"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
        None,
        [("a", '{"x": 1}'), ("b", "{}")],
    ),
    (LLAMA3, "The capital is {Paris}.", "The capital is {Paris}.", []),
    (LLAMA3, '{"not": "a call"', '{"not": "a call"', []),
]


def _calls(parser: ToolCallParser) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in parser.calls]


def _streamed(fmt: ToolFormat, pieces: list[str]) -> tuple[ToolCallParser, str, dict[int, str]]:
    parser = ToolCallParser(fmt)
    content, args = "", {}
    for out in [*(parser.feed(p) for p in pieces), parser.close()]:
        content += out.content
        for d in out.deltas:
            if d.id is not None:
                assert d.index == len(args), "calls start in order, once each"
                assert d.id.startswith("call_") and d.name
                args[d.index] = ""
            args[d.index] += d.arguments
    return parser, content, args


@pytest.mark.parametrize(("fmt", "answer", "content", "calls"), CASES)
def test_calls_and_content(
    fmt: ToolFormat, answer: str, content: str | None, calls: list[tuple[str, str]]
) -> None:
    parser, streamed, args = _streamed(fmt, [answer])
    assert _calls(parser) == calls
    assert parser.content == content
    assert [args[i] for i in range(len(args))] == [a for _, a in calls]
    if not calls and content:
        assert streamed == answer  # without calls the content is the text exactly
    for _, arguments in calls:
        json.loads(arguments)


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(0, 400), max_size=30))
def test_any_split_gives_the_same_answer(
    case: tuple[ToolFormat, str, str | None, list[tuple[str, str]]], cuts: list[int]
) -> None:
    fmt, answer, content, calls = case
    points = sorted({c % (len(answer) + 1) for c in cuts})
    pieces = [answer[a:b] for a, b in zip([0, *points], [*points, len(answer)], strict=True)]
    parser, streamed, args = _streamed(fmt, pieces)
    assert _calls(parser) == calls
    assert parser.content == content
    assert [args[i] for i in range(len(args))] == [a for _, a in calls]
    if not calls:
        assert streamed == (content or "")


def test_arguments_stream_before_the_call_ends() -> None:
    parser = ToolCallParser(HERMES)
    out = parser.feed('<tool_call>\n{"name": "weather", "arguments": {"city": "Li')
    assert [(d.name, d.arguments) for d in out.deltas] == [("weather", ""), (None, '{"city": "Li')]
    out = parser.feed('sbon"}}\n</tool_call>')
    assert [d.arguments for d in out.deltas] == ['sbon"}']
    assert not parser.close().deltas


def test_a_cut_call_keeps_what_was_written() -> None:
    parser = ToolCallParser(HERMES)
    parser.feed('Sure. <tool_call>\n{"name": "weather", "arguments": {"ci')
    parser.close()
    assert _calls(parser) == [("weather", '{"ci')] and parser.content == "Sure."


ONE_CALL = [
    (HERMES, '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": 12}}\n</tool_call>'),
    (SMOLLM2, '<tool_call>[{"name": "lookup_order", "arguments": {"order_id": 12}}]</tool_call>'),
    (LLAMA3, '{"name": "lookup_order", "parameters": {"order_id": 12}}'),
]


@pytest.mark.parametrize(("fmt", "text"), ONE_CALL)
def test_a_call_is_complete_only_once_its_object_is_closed(fmt: ToolFormat, text: str) -> None:
    """A call cut by max_tokens (its object not closed) is never complete, wherever the cut
    falls: the gateway never runs it."""
    parser = ToolCallParser(fmt)
    parser.feed(text)
    parser.close()
    assert [c.complete for c in parser.calls] == [True]
    close = text.rindex("}") + 1  # the call object's last brace (its arguments' closed before)
    for cut in range(1, close):
        partial = ToolCallParser(fmt)
        partial.feed(text[:cut])
        partial.close()
        assert not any(c.complete for c in partial.calls), (cut, text[:cut])
