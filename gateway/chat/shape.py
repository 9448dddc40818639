"""The sizes of a request's lists and maps, counted before a single item is validated.

Validation costs about a microsecond per JSON value (a pydantic model per message, per content
part, per bias entry): a 256 KiB widget body of 8,000 one-letter messages holds the event loop
for 12-30 ms to validate, only to be refused for having too many. Parsing the document alone
(pydantic-core's ``from_json``, the parser validation itself uses) costs a tenth of that, so
every body is parsed first and each bounded collection is counted; one over its bound is refused
with the 400 validation would give, and an unknown top-level field with the one OpenAI gives.
Validation then runs on the original bytes, so what is accepted and every other error message
stay exactly validation's (a body that is not JSON falls through to it)::

    messages                          min(2048, max_model_len)       too_many_messages
    content parts, in all messages    2048                           too_many_content_parts
    tool calls, in all messages       2048                           too_many_tool_calls
    tools, functions                  128
    logit_bias                        300 entries
    stop                              4 sequences
    metadata                          16 pairs (OpenAI's)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pydantic_core import from_json

from gateway.chat.bounds import (
    MAX_CONTENT_PARTS,
    MAX_LOGIT_BIAS,
    MAX_METADATA,
    MAX_STOP_SEQUENCES,
    MAX_TOOL_CALLS,
    too_many_messages,
)
from gateway.chat.tools.models import MAX_TOOLS
from gateway.errors import ApiError

# field -> (its bound, what its items are called in the refusal)
_FIELD_BOUNDS: dict[str, tuple[int, str]] = {
    "tools": (MAX_TOOLS, "tools"),
    "functions": (MAX_TOOLS, "functions"),
    "logit_bias": (MAX_LOGIT_BIAS, "entries"),
    "stop": (MAX_STOP_SEQUENCES, "stop sequences"),
    "metadata": (MAX_METADATA, "entries"),
}


def check_shape(body: bytes, known_fields: Collection[str], max_messages: int) -> None:
    """Refuse a body whose collections exceed their bounds, or with an unknown top-level field
    (``known_fields``: the request model's), before validation builds any of it."""
    try:
        doc = from_json(body)
    except ValueError:
        return  # not JSON: validation words the error
    if not isinstance(doc, dict):
        return
    for name in doc:
        if name not in known_fields:
            raise ApiError(
                400,
                f"Unrecognized request argument supplied: {name[:64]}",
                param=name[:64],
                code="unknown_parameter",
            )
    for name, (bound, items) in _FIELD_BOUNDS.items():
        value = doc.get(name)
        if isinstance(value, list | dict) and len(value) > bound:
            raise ApiError(
                400,
                f"invalid value for {name}: at most {bound} {items} are allowed, got {len(value)}",
                param=name,
            )
    messages = doc.get("messages")
    if isinstance(messages, list):
        _check_messages(messages, max_messages)


def _check_messages(messages: list[Any], max_messages: int) -> None:
    if len(messages) > max_messages:
        raise too_many_messages(len(messages), max_messages)
    entries = [m for m in messages if isinstance(m, Mapping)]
    parts = sum(_length(m.get("content")) for m in entries)
    if parts > MAX_CONTENT_PARTS:
        raise _too_many(parts, MAX_CONTENT_PARTS, "content parts", "too_many_content_parts")
    calls = sum(_length(m.get("tool_calls")) for m in entries)
    if calls > MAX_TOOL_CALLS:
        raise _too_many(calls, MAX_TOOL_CALLS, "tool calls", "too_many_tool_calls")


def _length(value: object) -> int:
    return len(value) if isinstance(value, list) else 0


def _too_many(count: int, bound: int, what: str, code: str) -> ApiError:
    return ApiError(
        400,
        f"too many {what}: {count} in all messages; at most {bound} are accepted",
        param="messages",
        code=code,
    )
