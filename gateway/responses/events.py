"""The Responses event stream: ``event: <type>`` / ``data: {...}`` with a sequence number.

response.created, response.in_progress
per message:  output_item.added, content_part.added, output_text.delta ...,
              output_text.done, content_part.done, output_item.done
per call:     output_item.added, function_call_arguments.delta ..., .done, output_item.done
response.completed (or response.incomplete), whose response is the stored one
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.errors import ApiError
from tenants.conversation_records import NewItem


class EventStream:
    def __init__(self, resp: web.StreamResponse) -> None:
        self.resp = resp
        self.seq = 0

    async def send(self, kind: str, **fields: Any) -> None:
        obj = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        data = json.dumps(obj, separators=(",", ":"))
        await self.resp.write(f"event: {kind}\ndata: {data}\n\n".encode())

    async def begin_message(self, item_id: str, index: int) -> None:
        item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress"}
        await self.send(
            "response.output_item.added", output_index=index, item={**item, "content": []}
        )
        await self.send(
            "response.content_part.added",
            item_id=item_id,
            output_index=index,
            content_index=0,
            part=_part(""),
        )

    async def text_delta(self, item_id: str, index: int, delta: str) -> None:
        await self.send(
            "response.output_text.delta",
            item_id=item_id,
            output_index=index,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    async def end_message(self, item: NewItem, index: int) -> None:
        text = item.data["content"][0]["text"]
        where = {"item_id": item.id, "output_index": index, "content_index": 0}
        await self.send("response.output_text.done", **where, text=text, logprobs=[])
        await self.send("response.content_part.done", **where, part=_part(text))
        await self.send("response.output_item.done", output_index=index, item=dict(item.data))

    async def call(self, item: NewItem, index: int) -> None:
        """A whole call at once (its arguments in one delta)."""
        data = item.data
        await self.begin_call(item.id, index, data["call_id"], data["name"])
        await self.arguments_delta(item.id, index, data["arguments"])
        await self.end_call(item, index)

    async def begin_call(self, item_id: str, index: int, call_id: str, name: str) -> None:
        item = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
        started = {**item, "arguments": "", "status": "in_progress"}
        await self.send("response.output_item.added", output_index=index, item=started)

    async def arguments_delta(self, item_id: str, index: int, delta: str) -> None:
        await self.send(
            "response.function_call_arguments.delta",
            item_id=item_id,
            output_index=index,
            delta=delta,
        )

    async def end_call(self, item: NewItem, index: int) -> None:
        await self.send(
            "response.function_call_arguments.done",
            item_id=item.id,
            output_index=index,
            arguments=item.data["arguments"],
            name=item.data["name"],
        )
        await self.send("response.output_item.done", output_index=index, item=dict(item.data))

    async def error(self, err: ApiError) -> None:
        """A failure after the stream started (OpenAI's ``error`` event); the stream ends."""
        await self.send("error", code=err.code or err.type, message=err.message, param=err.param)

    async def message(self, item: NewItem, index: int) -> None:
        """A whole message at once (an answer parsed for calls before it is sent)."""
        await self.begin_message(item.id, index)
        text = item.data["content"][0]["text"]
        if text:
            await self.text_delta(item.id, index, text)
        await self.end_message(item, index)


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
