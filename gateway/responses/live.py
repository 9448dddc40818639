"""A streamed answer that may hold calls, sent as Responses events as it becomes certain.

The answer's text goes through the tool-call parser (gateway/chat/tools/parser.py) piece by piece:
its content as ``output_text.delta`` events of a message item, begun at the first content; each
call as a ``function_call`` item, added once its name is complete, its arguments in fragments as
the model writes them. Items keep the order in which they began, and the stored response has
them in that order with the same ids, so what was streamed is what is stored.
"""

from __future__ import annotations

from gateway.chat.tools.answer import finish_reason
from gateway.chat.tools.formats import ToolFormat
from gateway.chat.tools.parser import Parsed, ToolCall, ToolCallParser
from gateway.responses.events import EventStream
from gateway.responses.items import call_item, message_item
from gateway.responses.output import Answer
from tenants.conversation_records import NewItem, new_id


class LiveOutput:
    def __init__(self, events: EventStream, fmt: ToolFormat | None) -> None:
        """``fmt``: the format calls are parsed in; None: the answer is all text."""
        self.events = events
        self.parser = ToolCallParser(fmt) if fmt is not None else None
        self.text: list[str] = []
        self.message: tuple[str, int] | None = None  # (item id, output index), once begun
        self.calls: dict[int, tuple[str, int]] = {}  # call index -> (item id, output index)

    async def feed(self, text: str) -> None:
        await self._send(self.parser.feed(text) if self.parser is not None else Parsed(text))

    async def close(self) -> None:
        await self._send(self.parser.close() if self.parser is not None else Parsed())

    async def _send(self, parsed: Parsed) -> None:
        if parsed.content:
            if self.message is None:
                self.message = (new_id("msg"), self._next())
                await self.events.begin_message(*self.message)
            self.text.append(parsed.content)
            await self.events.text_delta(*self.message, parsed.content)
        for delta in parsed.deltas:
            if delta.id is not None and delta.name is not None:  # a call's first delta
                self.calls[delta.index] = (new_id("fc"), self._next())
                await self.events.begin_call(*self.calls[delta.index], delta.id, delta.name)
            if delta.arguments:
                await self.events.arguments_delta(*self.calls[delta.index], delta.arguments)

    def _calls(self) -> list[ToolCall]:
        return self.parser.calls if self.parser is not None else []

    def _next(self) -> int:
        """The output index of the item beginning now: the count of those begun before it."""
        return len(self.calls) + (self.message is not None)

    def answer(self, reason: str) -> Answer:
        """The answer as streamed (``reason``: the engine's finish reason)."""
        calls = tuple(c.body() for c in self._calls())
        text = "".join(self.text) if self.message is not None else None
        return Answer(text, calls, finish_reason(reason, bool(calls)))

    def items(self, answer: Answer) -> list[NewItem]:
        """The output items in the order they began (an empty message when nothing began)."""
        begun: list[tuple[int, NewItem]] = []
        if self.message is not None:
            item_id, index = self.message
            begun.append((index, message_item("assistant", answer.text or "", item_id)))
        for k, (item_id, index) in self.calls.items():
            call = self._calls()[k]
            begun.append((index, call_item(call.id, call.name, call.arguments, item_id)))
        items = [item for _, item in sorted(begun, key=lambda pair: pair[0])]
        if not items:
            items = [message_item("assistant", "")]
        if answer.status == "incomplete" and items[0].type == "message":
            items[0].data["status"] = "incomplete"
        return items

    async def finish(self, items: list[NewItem]) -> None:
        """Each item's closing events (a message that never began: all of its events)."""
        for index, item in enumerate(items):
            if item.type == "function_call":
                await self.events.end_call(item, index)
                continue
            if self.message is None:
                await self.events.begin_message(item.id, index)
            await self.events.end_message(item, index)
