"""A Responses request as the chat request the chat path serves: instructions as the first
(system) message under the tenant's client-system policy, then the history, then the input;
function tools, ``tool_choice`` and ``text.format`` in chat's shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from gateway.access.auth import Principal
from gateway.chat.messages import ChatMessage
from gateway.chat.schemas import ChatRequest, check_semantics
from gateway.errors import ApiError
from gateway.responses.request import ResponsesRequest, function_tools, validation_error


def check_instructions(req: ResponsesRequest, principal: Principal) -> None:
    """Client ``instructions`` and system / developer input follow the client-system policy,
    exactly as a client system message does in chat."""
    items = req.input if isinstance(req.input, list) else []
    check_system_items(items, principal, "input", ["instructions"] if req.instructions else [])


def check_system_items(
    items: Sequence[Any], principal: Principal, param: str, refused: list[str] | None = None
) -> None:
    """System / developer items (of ``input``, or of a conversation's ``items``) under the
    client-system policy."""
    if principal.allow_client_system:
        return
    source = "from the widget" if principal.is_widget else "from clients"
    refused = list(refused or [])
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("role") in ("system", "developer"):
            refused.append(f"{param}[{i}].role")
    if refused:
        raise ApiError(
            400,
            f"this tenant does not accept system or developer messages {source}",
            param=refused[0],
            code="system_message_not_allowed",
        )


def _tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    out = []
    for t in function_tools(req):
        fn: dict[str, Any] = {"name": t.name}
        for name in ("description", "parameters", "strict"):
            if getattr(t, name) is not None:
                fn[name] = getattr(t, name)
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else {"type": fmt.type}
    if fmt.name is None:
        raise ApiError(400, "text.format.name is required", param="text.format.name")
    spec: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_ or {}}
    if fmt.description is not None:
        spec["description"] = fmt.description
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}


def chat_request(
    req: ResponsesRequest,
    instructions: Sequence[str],
    history: Sequence[ChatMessage],
    new: Sequence[ChatMessage],
    principal: Principal,
    store: bool,
) -> ChatRequest:
    if not new and not history:
        raise ApiError(400, "input is required", param="input")
    system = [ChatMessage(role="system", content=text) for text in instructions]
    messages = [m.model_dump(exclude_none=True) for m in (*system, *history, *new)]
    doc: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "stream": bool(req.stream),
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "user": req.end_user,
        "tools": _tools(req),
        "tool_choice": _tool_choice(req),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _response_format(req),
    }
    try:
        chat = ChatRequest.model_validate({k: v for k, v in doc.items() if v is not None})
    except ValidationError as exc:
        raise validation_error(exc) from None
    declared = [t.name for t in principal.runtime.tool_policy.tools]
    check_semantics(chat, declared)
    return chat
