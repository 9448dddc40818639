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

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.chat.tools.formats import ToolFormat, detect_format, renders_tools
from gateway.chat.tools.models import NamedToolChoice, ResponseFormat, ToolChoice, ToolDef
from gateway.chat.tools.render import tool_definition, tool_lines
from gateway.prompts.tenant_prefix import ChatTokenizer, EncodedPrefix, encode_prefix
from tenants.runtime import TenantRuntime, ToolPolicy
from tenants.tools import TenantTool


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


class VersionPrefixes:
    """A prompt version's encoded prefix from its text and tools, the last few remembered: an
    admin write counts a version's tokens and the pin manager pins the same prefix a moment
    later (gateway/admin/prompts.py, gateway/prompts/pins.py), so a 200k-character prompt is encoded
    once. Encoding runs on the tokenize pool's threads: the memory is locked (the work is not)."""

    def __init__(self, tokenizer: ChatTokenizer, template: str | None, remember: int = 4) -> None:
        self._tokenizer = tokenizer
        self._fmt, self._native = detect_format(template), renders_tools(template)
        self._recent: deque[tuple[str, tuple[TenantTool, ...], EncodedPrefix]]
        self._recent = deque(maxlen=remember)
        self._lock = threading.Lock()

    def encode(self, text: str | None, policy: ToolPolicy) -> EncodedPrefix:
        if not text:
            return encode_prefix(self._tokenizer, text)
        with self._lock:
            for seen, tools, encoded in self._recent:
                if tools == policy.tools and seen == text:
                    return encoded
        turns, kwargs = prefix_parts(tenant_tool_defs(policy), self._fmt, self._native)
        encoded = encode_prefix(self._tokenizer, text, turns, kwargs)
        with self._lock:
            self._recent.append((text, policy.tools, encoded))
        return encoded

    def of_runtime(self, rt: TenantRuntime) -> EncodedPrefix:
        """What the pin manager builds a tenant's prefix from (its prompt and its tools)."""
        return self.encode(rt.prompt_text, rt.tool_policy)


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
