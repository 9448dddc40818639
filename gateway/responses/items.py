"""Items: what a client sends as ``input`` (and ``POST /v1/conversations/{id}/items``), stored as
OpenAI returns them, and turned into chat messages for the prompt.

    input item                              stored item (``data``)
    "text" / {role, content}                message: role, content [input_text | output_text]
    {type: function_call, call_id, ...}     function_call: call_id, name, arguments
    {type: function_call_output, ...}       function_call_output: call_id, output (text)

Images, files, audio, reasoning items and item references are refused (400 naming the field).
Consecutive function calls after an assistant message are one assistant chat turn with
``tool_calls``; an output answers the call with its ``call_id`` (a ``tool`` message).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.chat.messages import ChatMessage
from gateway.chat.tools.models import CalledFunction, ToolCallIn
from gateway.errors import ApiError
from gateway.responses.request import unsupported
from tenants.conversation_records import NewItem, new_id

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
MAX_ITEMS = 2048


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"invalid value for {param}: {message}", param=param)


def _text_of(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(param, "content must be a string or an array of text parts")
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _bad(f"{param}[{j}]", "a content part is an object with a type")
        kind = part["type"]
        if kind not in TEXT_PARTS:
            raise ApiError(
                400,
                f"{param}[{j}]: content parts of type {kind[:32]!r} are not supported; "
                "this model reads text only",
                param=f"{param}[{j}].type",
                code="unsupported_content",
            )
        if not isinstance(part.get("text"), str):
            raise _bad(f"{param}[{j}].text", "must be a string")
        parts.append(part["text"])
    return "".join(parts)


def message_item(role: str, text: str, item_id: str | None = None) -> NewItem:
    item_id = item_id or new_id("msg")
    if role == "assistant":
        part: dict[str, Any] = {
            "type": "output_text",
            "text": text,
            "annotations": [],
            "logprobs": [],
        }
    else:
        part = {"type": "input_text", "text": text}
    data = {"id": item_id, "type": "message", "role": role, "content": [part]}
    data["status"] = "completed"
    return NewItem(item_id, "message", data)


def call_item(call_id: str, name: str, arguments: str, item_id: str | None = None) -> NewItem:
    item_id = item_id or new_id("fc")
    data = {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }
    return NewItem(item_id, "function_call", data)


def output_item(call_id: str, output: str, item_id: str | None = None) -> NewItem:
    item_id = item_id or new_id("fco")
    data = {
        "id": item_id,
        "type": "function_call_output",
        "call_id": call_id,
        "output": output,
        "status": "completed",
    }
    return NewItem(item_id, "function_call_output", data)


def _str_field(item: dict[str, Any], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or (not value and name != "arguments"):
        raise _bad(f"{param}.{name}", "must be a non-empty string")
    return value


def _own_id(item: dict[str, Any]) -> str | None:
    value = item.get("id")
    return value if isinstance(value, str) and 0 < len(value) <= 64 else None


def parse_item(item: Any, param: str) -> NewItem:
    if not isinstance(item, dict):
        raise _bad(param, "an input item is an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise _bad(f"{param}.role", f"must be one of {', '.join(ROLES)}")
        text = _text_of(item.get("content"), f"{param}.content")
        return message_item(role, text, _own_id(item))
    if kind == "function_call":
        call_id = _str_field(item, "call_id", param)
        name = _str_field(item, "name", param)
        return call_item(call_id, name, _str_field(item, "arguments", param), _own_id(item))
    if kind == "item_reference":  # resolved against the store (gateway/responses/history.py)
        ref = _own_id(item)
        if ref is None:
            raise _bad(f"{param}.id", "must be the id of a stored item (1-64 characters)")
        return NewItem(ref, "item_reference", {"type": "item_reference", "id": ref})
    if kind == "function_call_output":
        call_id = _str_field(item, "call_id", param)
        output = item.get("output")
        text = output if isinstance(output, str) else _text_of(output, f"{param}.output")
        return output_item(call_id, text, _own_id(item))
    name = str(kind)[:40] if isinstance(kind, str) else "non-string"
    what = (
        "reasoning items are not supported"
        if kind == "reasoning"
        else (f"input items of type {name!r} are not supported")
    )
    raise unsupported(f"{param}.type", what)


def parse_input(raw: str | list[Any] | None, param: str = "input") -> list[NewItem]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [message_item("user", raw)]
    if len(raw) > MAX_ITEMS:
        raise _bad(param, f"at most {MAX_ITEMS} items are allowed, got {len(raw)}")
    return [parse_item(item, f"{param}[{i}]") for i, item in enumerate(raw)]


def _text(data: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in data.get("content", []) if isinstance(p, dict))


def to_messages(items: Sequence[dict[str, Any]]) -> list[ChatMessage]:
    """Stored items (``data``) as chat messages, in order."""
    out: list[ChatMessage] = []
    for data in items:
        kind = data.get("type")
        if kind == "message":
            out.append(ChatMessage(role=data["role"], content=_text(data)))
        elif kind == "function_call":
            call = ToolCallIn(
                id=data["call_id"],
                type="function",
                function=CalledFunction(name=data["name"], arguments=data["arguments"]),
            )
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                calls = [*(last.tool_calls or []), call]
                content = last.content if last.text else None
                out[-1] = ChatMessage(role="assistant", content=content, tool_calls=calls)
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif kind == "function_call_output":
            out.append(
                ChatMessage(role="tool", content=data["output"], tool_call_id=data["call_id"])
            )
    return out
