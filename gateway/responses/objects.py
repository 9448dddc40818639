"""The JSON objects of the Responses and Conversations APIs (OpenAI's ``Response``,
``ConversationResource``, item lists), built from the request and the answer."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.responses.request import ResponsesRequest
from tenants.conversation_records import ConversationRecord, ItemRecord, Page


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int
    cached_tokens: int

    def body(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


def _tools(req: ResponsesRequest) -> list[dict[str, Any]]:
    out = []
    for tool in req.tools or []:
        t = {"type": "function", "name": tool["name"], "strict": tool.get("strict", True)}
        t["parameters"] = tool.get("parameters")
        if tool.get("description") is not None:
            t["description"] = tool["description"]
        out.append(t)
    return out


def _format(req: ResponsesRequest) -> dict[str, Any]:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return {"type": "text"}
    if fmt.type == "json_object":
        return {"type": "json_object"}
    out: dict[str, Any] = {"type": "json_schema", "name": fmt.name, "schema": fmt.schema_ or {}}
    out["strict"] = fmt.strict
    if fmt.description is not None:
        out["description"] = fmt.description
    return out


def _tool_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else {"type": "function", "name": choice.name}


def response_body(
    rid: str,
    req: ResponsesRequest,
    *,
    created_at: int,
    status: str,
    output: Sequence[dict[str, Any]],
    usage: Usage | None,
    store: bool,
    incomplete: str | None = None,
) -> dict[str, Any]:
    conversation = req.conversation_id
    done = status in ("completed", "incomplete")
    body = {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": int(time.time()) if done else None,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
        "output": list(output),
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "prompt_cache_key": req.prompt_cache_key,
        "prompt_cache_retention": req.prompt_cache_retention,
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": req.safety_identifier,
        "service_tier": "default",
        "store": store,
        "temperature": req.temperature if req.temperature is not None else 1.0,
        "text": {"format": _format(req), "verbosity": "medium"},
        "tool_choice": _tool_choice(req),
        "tools": _tools(req),
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "truncation": "disabled",
        "usage": usage.body() if usage is not None else None,
        "user": req.user,
        "metadata": dict(req.metadata or {}),
        "conversation": {"id": conversation} if conversation is not None else None,
    }
    # Not nullable in OpenAI's schema: absent until known.
    return {k: v for k, v in body.items() if v is not None or k not in ("usage", "user")}


def conversation_body(conv: ConversationRecord) -> dict[str, Any]:
    return {
        "id": conv.id,
        "object": "conversation",
        "metadata": dict(conv.metadata),
        "created_at": int(conv.created_at.timestamp()),
    }


def item_list(items: Sequence[ItemRecord], has_more: bool) -> dict[str, Any]:
    data = [dict(i.data) for i in items]
    return {
        "object": "list",
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else "",
        "last_id": data[-1]["id"] if data else "",
    }


def page_body(page: Page) -> dict[str, Any]:
    return item_list(page.items, page.has_more)


def deleted_body(object_id: str, kind: str) -> dict[str, Any]:
    return {"id": object_id, "object": kind, "deleted": True}
