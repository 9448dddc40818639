"""Responses events of an answer parsed for calls as it streams (gateway/responses/live.py):
text before a call, calls in fragments, a cut call, an empty answer; the items stored are the
items streamed, in the order they began."""

from __future__ import annotations

import json
from typing import Any

from gateway.chat.tools.formats import HERMES
from gateway.responses.events import EventStream
from gateway.responses.live import LiveOutput

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


class Recorded:
    """What an EventStream wrote, as (type, fields) pairs."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def write(self, data: bytes) -> None:
        line = data.decode().split("\n")[1]
        self.events.append(json.loads(line.removeprefix("data: ")))


async def streamed(text: str, reason: str, step: int = 5) -> tuple[LiveOutput, list[Any]]:
    out = Recorded()
    events = EventStream(out)  # type: ignore[arg-type]  # only write is used
    live = LiveOutput(events, HERMES)
    for at in range(0, len(text), step):
        await live.feed(text[at : at + step])
    await live.close()
    items = live.items(live.answer(reason))
    await live.finish(items)
    return live, [items, out.events]


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"].removeprefix("response.") for e in events]


async def test_text_then_a_call_stream_in_the_order_written() -> None:
    live, (items, events) = await streamed(f"Let me look. {CALL}", "stop")
    assert [i.type for i in items] == ["message", "function_call"]
    assert items[0].data["content"][0]["text"] == "Let me look."
    assert items[1].data["arguments"] == '{"city": "Oslo"}'
    assert live.answer("stop").finish_reason == "tool_calls"
    k = kinds(events)
    assert k[:3] == ["output_item.added", "content_part.added", "output_text.delta"]
    first_call = k.index("function_call_arguments.delta")
    assert k.index("output_item.added", 1) < first_call  # added before its arguments
    deltas = [e["delta"] for e in events if e["type"].endswith("arguments.delta")]
    assert len(deltas) > 1 and "".join(deltas) == '{"city": "Oslo"}'
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [i.id for i in items]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_a_call_cut_by_the_token_limit_is_incomplete() -> None:
    live, (items, _) = await streamed(CALL[:40], "length")
    assert [i.type for i in items] == ["function_call"]
    answer = live.answer("length")
    assert answer.status == "incomplete" and answer.finish_reason == "length"


async def test_an_empty_answer_is_one_empty_message() -> None:
    _, (items, events) = await streamed("", "stop")
    assert [i.type for i in items] == ["message"] and items[0].data["content"][0]["text"] == ""
    assert kinds(events) == [
        "output_item.added",
        "content_part.added",
        "output_text.done",
        "content_part.done",
        "output_item.done",
    ]
