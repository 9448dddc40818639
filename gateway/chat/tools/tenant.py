"""A tenant's tools in a request: inside its pinned prefix, before the client's.

    prefix        template([tenant system, <tools turn>])       fallback templates
                  template([tenant system], tools=tenant's)      templates that render tools
    request       tenant's tools ++ client's tools (server keys; names must differ)

A fallback template gets the tenant's tools as their own system turn right after the tenant's
prompt (in the prefix); a client's tools come as a second tools turn after it, so the prefix
stays a prefix of every prompt. A template that renders tools itself gets every tool in one
``tools=`` list, tenant's first: the prompt then shares the prefix up to where the client's tools
begin (gateway/chat/prompt.py's ``shared_prefix``).

The tool choice of a request that sends none (widget traffic always) is the version's
``tool_choice``; a request asking for a ``response_format`` other than text without a choice
gets ``"none"`` (its grammar is the format's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.chat.tools.formats import ToolFormat, detect_format, renders_tools
from gateway.chat.tools.models import NamedToolChoice, ResponseFormat, ToolChoice, ToolDef
from gateway.chat.tools.render import tool_definition, tool_lines
from gateway.tenant_prefix import ChatTokenizer, TenantPrefix, build_prefix
from tenants.runtime import TenantRuntime, ToolPolicy


def tenant_tool_defs(policy: ToolPolicy) -> list[ToolDef]:
    return [ToolDef.model_validate(t.definition()) for t in policy.tools]


def prefix_parts(
    tools: Sequence[ToolDef], fmt: ToolFormat, native: bool
) -> tuple[list[Mapping[str, Any]], dict[str, Any]]:
    """The prefix's tool turns and template keyword arguments (none without tools)."""
    if not tools:
        return [], {}
    if native:
        return [], {"tools": [tool_definition(t) for t in tools], "tools_in_user_message": False}
    turn = {"role": "system", "content": fmt.fallback.format(tools=tool_lines(tools, fmt))}
    return [turn], {}


def prefix_builder(
    tokenizer: ChatTokenizer, template: str | None
) -> Callable[[TenantRuntime], TenantPrefix]:
    """What the pin manager builds a tenant's prefix with (its prompt and its tools)."""
    fmt, native = detect_format(template), renders_tools(template)

    def build(rt: TenantRuntime) -> TenantPrefix:
        turns, kwargs = prefix_parts(tenant_tool_defs(rt.tool_policy), fmt, native)
        return build_prefix(tokenizer, rt.prompt_text, turns, kwargs)

    return build


def request_choice(
    choice: ToolChoice | None, response_format: ResponseFormat | None, policy: ToolPolicy
) -> ToolChoice | None:
    if choice is not None or not policy.tools:
        return choice
    if response_format is not None and response_format.type != "text":
        return "none"
    default = policy.tool_choice
    if isinstance(default, str):
        return default
    return NamedToolChoice.model_validate(default)
