"""Rules between the tool and structured-output fields that their shapes do not express.

Each failure is a 400 naming the parameter, as OpenAI answers it: a ``tool_choice`` without
``tools``, a named choice that names no declared function, two functions of one name, a
``tool`` message that answers no earlier call, an assistant turn with neither content nor calls,
a ``response_format`` type kvgate does not know. Schemas themselves are checked by the grammar
engine later (gateway/chat/grammar_check.py): a feature it cannot enforce is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.chat.messages import ChatMessage
from gateway.chat.tools.models import NamedToolChoice, ResponseFormat, ToolChoice, ToolDef
from gateway.errors import ApiError

FORMAT_TYPES = ("text", "json_object", "json_schema")


def check_tool_fields(
    tools: Sequence[ToolDef],
    choice: ToolChoice | None,
    response_format: ResponseFormat | None,
    messages: Sequence[ChatMessage],
    declared: Sequence[str] = (),
) -> None:
    """``declared``: the tenant's tools (gateway/chat/tools/tenant.py), declared before the
    client's: a choice may name them, a client's tool may not take their names."""
    _check_tools(tools, choice, declared)
    if response_format is not None:
        _check_format(response_format)
        uses_tools = (bool(tools) and choice != "none") or (
            bool(declared) and choice not in (None, "none")
        )
        if uses_tools and response_format.type != "text":
            raise ApiError(
                400,
                "response_format other than text together with tools is not supported; send "
                'one of them, or tool_choice "none"',
                param="response_format",
                code="unsupported_parameter",
            )
    check_messages(messages)


def _check_tools(tools: Sequence[ToolDef], choice: object, declared: Sequence[str]) -> None:
    names = [t.function.name for t in tools]
    seen: set[str] = set(declared)
    for i, name in enumerate(names):
        if name in declared:
            raise ApiError(
                400,
                f"tools[{i}].function.name: {name!r} is a tool of this tenant already",
                param=f"tools[{i}].function.name",
                code="tool_name_conflict",
            )
        if name in seen:
            raise ApiError(
                400,
                f"tools[{i}].function.name: the function name {name!r} is declared twice",
                param=f"tools[{i}].function.name",
            )
        seen.add(name)
    if choice is None or choice == "none":
        return
    if not tools and not declared:
        raise ApiError(
            400,
            "tool_choice is only allowed when tools are specified",
            param="tool_choice",
        )
    if isinstance(choice, NamedToolChoice) and choice.function.name not in seen:
        raise ApiError(
            400,
            f"tool_choice names the function {choice.function.name!r}, which is not in tools",
            param="tool_choice",
        )


def _check_format(fmt: ResponseFormat) -> None:
    if fmt.type not in FORMAT_TYPES:
        raise ApiError(
            400,
            f"response_format: type {fmt.type[:32]!r} is not supported; use one of "
            + ", ".join(repr(t) for t in FORMAT_TYPES),
            param="response_format.type",
            code="unsupported_parameter",
        )
    if fmt.type == "json_schema" and fmt.json_schema is None:
        raise ApiError(
            400,
            "response_format: type 'json_schema' needs a json_schema object (name, schema)",
            param="response_format.json_schema",
        )


def check_messages(messages: Sequence[ChatMessage]) -> None:
    """Tool turns in the conversation: calls only from the assistant, content absent only there
    (with calls), every ``tool`` message the answer to a call made earlier."""
    called: set[str] = set()
    for i, m in enumerate(messages):
        if m.content is not None and not m.tool_calls and m.role != "tool":
            continue  # a plain message (the loop runs on the event loop: keep it short)
        if m.tool_calls and m.role != "assistant":
            raise ApiError(
                400,
                f"messages[{i}]: only assistant messages carry tool_calls",
                param=f"messages[{i}].tool_calls",
            )
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise ApiError(
                400,
                f"messages[{i}].content: content is required unless an assistant message "
                "has tool_calls",
                param=f"messages[{i}].content",
            )
        called.update(c.id for c in m.tool_calls or ())
        if m.role == "tool":
            if m.tool_call_id is None:
                raise ApiError(
                    400,
                    f"messages[{i}]: a tool message needs tool_call_id",
                    param=f"messages[{i}].tool_call_id",
                )
            if m.tool_call_id not in called:
                raise ApiError(
                    400,
                    f"messages[{i}]: a tool message must answer a tool call of an earlier "
                    "assistant message (no call has this tool_call_id)",
                    param=f"messages[{i}].tool_call_id",
                )
