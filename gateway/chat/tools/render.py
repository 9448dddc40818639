"""The conversation as the chat template takes it: tools, earlier calls and their results.

A template that renders tools itself (it reads ``tools``: Qwen2.5, Llama 3.1, Hermes) gets them
as Hugging Face templates take them: ``tools=[{"type": "function", "function": {...}}]``,
assistant turns with ``tool_calls`` (arguments as a mapping), ``tool`` turns with
``tool_call_id``, and ``tools_in_user_message=False`` (Llama 3.1 puts them in the system turn,
not the first user turn). Any other template gets the documented fallback
(gateway/chat/tools/formats.py): one system turn with the family's instructions and the tools,
right after the tenant's system prompt (so the tenant prefix stays a prefix of the prompt: its
pinned blocks still match), earlier calls written in the family's own call format, results as
``<tool_response>`` turns.

Rendering is deterministic: tools in the order sent, each as ``{"type", "function": {"name",
"description", "parameters"}}`` with the schema as sent, JSON with fixed separators; the same
tools give the same tokens, so a client's fixed tools are cached with its conversation (behind
the tenant prefix, in the client's own cache scope: gateway/chat/cache_scope.py). Without tools
and tool turns, the messages are exactly what they always were.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.chat.messages import ChatMessage
from gateway.chat.tools.formats import ToolFormat
from gateway.chat.tools.models import ToolCallIn, ToolDef


@dataclass(frozen=True)
class Rendering:
    """What ``apply_chat_template`` gets for the client's part of the prompt."""

    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any] = field(default_factory=dict)


def dumps(value: Any, indent: int | None = None) -> str:
    """The one JSON rendering of tool text: fixed separators, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def tool_definition(tool: ToolDef) -> dict[str, Any]:
    fn = tool.function
    body: dict[str, Any] = {"name": fn.name}
    if fn.description is not None:
        body["description"] = fn.description
    body["parameters"] = fn.parameters_schema
    return {"type": "function", "function": body}


def tool_texts(tools: Sequence[ToolDef] | None) -> list[str]:
    """The tools' text as it reaches the prompt (what the prompt bounds count)."""
    return [dumps(tool_definition(t)) for t in tools or ()]


def render(
    messages: Sequence[ChatMessage], tools: Sequence[ToolDef], fmt: ToolFormat, native: bool
) -> Rendering:
    if not tools and not any(m.tool_calls or m.role == "tool" for m in messages):
        return Rendering(plain_messages(messages))
    if native:
        return _native(messages, tools)
    return _fallback(messages, tools, fmt)


def plain_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    # "developer" is OpenAI's newer name for a system message.
    return [{"role": "system" if m.is_system else m.role, "content": m.text} for m in messages]


def _native(messages: Sequence[ChatMessage], tools: Sequence[ToolDef]) -> Rendering:
    names = _called_names(messages)
    out: list[dict[str, Any]] = []
    for m in messages:
        turn: dict[str, Any] = {"role": "system" if m.is_system else m.role, "content": m.text}
        if m.tool_calls:  # only then: some templates test ``'tool_calls' in message``
            turn["tool_calls"] = [_native_call(c) for c in m.tool_calls]
        if m.role == "tool":
            turn["tool_call_id"] = m.tool_call_id
            turn["name"] = names.get(m.tool_call_id or "", "")
        out.append(turn)
    kwargs: dict[str, Any] = {}
    if tools:
        kwargs = {"tools": [tool_definition(t) for t in tools], "tools_in_user_message": False}
    return Rendering(out, kwargs)


def _native_call(call: ToolCallIn) -> dict[str, Any]:
    fn = call.function
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": fn.name, "arguments": fn.arguments_value},
    }


def _fallback(
    messages: Sequence[ChatMessage], tools: Sequence[ToolDef], fmt: ToolFormat
) -> Rendering:
    out: list[dict[str, Any]] = []
    if tools:
        out.append({"role": "system", "content": fmt.fallback.format(tools=tool_lines(tools, fmt))})
    for m in messages:
        if m.role == "tool":
            out.append({"role": fmt.tool_role, "content": _tool_result(m.text, fmt)})
        elif m.tool_calls:
            calls = call_text([(c.function.name, c.function.arguments) for c in m.tool_calls], fmt)
            content = f"{m.text}\n{calls}" if m.text else calls
            out.append({"role": "assistant", "content": content})
        else:
            out.append({"role": "system" if m.is_system else m.role, "content": m.text})
    return Rendering(out)


def tool_lines(tools: Sequence[ToolDef], fmt: ToolFormat) -> str:
    defs = [tool_definition(t) for t in tools]
    if fmt.array:  # SmolLM2: one JSON list of the functions
        return dumps([d["function"] for d in defs])
    if fmt.open is None:  # Llama 3.1 writes each tool indented, a blank line apart
        return "\n\n".join(dumps(d, indent=4) for d in defs)
    return "\n".join(dumps(d) for d in defs)


def call_text(calls: Sequence[tuple[str, str]], fmt: ToolFormat) -> str:
    """Calls (name, JSON arguments text) written the way the family writes them."""
    objs = [
        f'{{"name": {dumps(name)}, "{fmt.args_key}": {_json_or_string(args)}}}'
        for name, args in calls
    ]
    if fmt.array:
        return f"{fmt.open}[{', '.join(objs)}]{fmt.close}"
    if fmt.open is None:
        return fmt.separator.join(objs)
    return fmt.separator.join(f"{fmt.open}{fmt.pad}{o}{fmt.pad}{fmt.close}" for o in objs)


def _json_or_string(arguments: str) -> str:
    """The arguments as sent when they are JSON (the model's own text), else as a JSON string."""
    try:
        json.loads(arguments)
    except ValueError:
        return dumps(arguments)
    return arguments


def _tool_result(text: str, fmt: ToolFormat) -> str:
    if fmt.open is None:
        return text
    return f"<tool_response>\n{text}\n</tool_response>"


def _called_names(messages: Sequence[ChatMessage]) -> dict[str, str]:
    return {c.id: c.function.name for m in messages for c in m.tool_calls or ()}
