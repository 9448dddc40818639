"""Tenant tools: the functions a prompt version carries beside its text.

    PUT /admin/v1/tenants/{id}/system-prompt
      {text, tools?: [{type: "function", function: {name, description?, parameters?},
                       source?: {webhook: URL} | {mcp: SERVER_ID}, status_text?}],
       tool_choice?, max_tool_rounds?}

A tool without a ``source`` is declared to the model only (a server key's client runs it); one
with a source is run by the gateway (gateway/chat/tools/run/). Validation here is shape and size
only: ``parameters`` must be a JSON Schema of an object (its draft's meta-schema, 2020-12 by
default), names unique, everything bounded. Whether an MCP server id belongs to the tenant
is the service's check (it needs the database). Errors are ``InvalidTools`` (400, naming the field).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema_rs
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tenants.errors import InvalidField

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
MAX_TOOLS = 64
MAX_DESCRIPTION_CHARS = 4_000
MAX_PARAMETERS_BYTES = 16_384  # one tool's schema, as compact JSON
MAX_TOOLS_BYTES = 131_072  # every tool of a version together
MAX_STATUS_CHARS = 200
MAX_URL_CHARS = 2_048
MAX_TOOL_ROUNDS = 16
DEFAULT_TOOL_ROUNDS = 4


class InvalidTools(InvalidField):
    """A version's tools are malformed (400 ``invalid_tools``, ``param`` the dotted field)."""


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionIn(_In):
    name: str = Field(pattern=NAME_RE.pattern)
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None


class WebhookSource(_In):
    webhook: str = Field(min_length=1, max_length=MAX_URL_CHARS)


class McpSource(_In):
    mcp: str = Field(min_length=1, max_length=64)


class ToolIn(_In):
    type: Literal["function"]
    function: FunctionIn
    source: WebhookSource | McpSource | None = None
    status_text: str | None = Field(default=None, min_length=1, max_length=MAX_STATUS_CHARS)


class NamedChoice(_In):
    type: Literal["function"]
    function: dict[str, str]


ToolChoiceIn = Literal["auto", "required", "none"] | NamedChoice


class ToolOptions(_In):
    """How the gateway uses a version's tools: the choice of requests that send none (widget
    traffic always) and the most rounds of gateway-run tools per turn."""

    tool_choice: ToolChoiceIn = "auto"
    max_tool_rounds: int = Field(default=DEFAULT_TOOL_ROUNDS, ge=0, le=MAX_TOOL_ROUNDS)


@dataclass(frozen=True)
class TenantTool:
    """A tool of the active version as the request path holds it."""

    name: str
    description: str | None
    parameters: dict[str, Any] | None
    webhook: str | None = None
    mcp: str | None = None
    status_text: str | None = None

    @property
    def runs_on_gateway(self) -> bool:
        return self.webhook is not None or self.mcp is not None

    def definition(self) -> dict[str, Any]:
        """The OpenAI tool definition the model sees (never the source)."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        if self.parameters is not None:
            fn["parameters"] = self.parameters
        return {"type": "function", "function": fn}


def parse_tools(raw: Any) -> list[ToolIn]:
    """Validate the ``tools`` field: shapes, then schemas, names and sizes."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidTools("tools: must be a list of tool definitions", param="tools")
    if len(raw) > MAX_TOOLS:
        raise InvalidTools(f"tools: at most {MAX_TOOLS} tools per version", param="tools")
    tools = [_parse_one(i, item) for i, item in enumerate(raw)]
    _check_names(tools)
    total = sum(len(_compact(t.model_dump(exclude_none=True))) for t in tools)
    if total > MAX_TOOLS_BYTES:
        raise InvalidTools(f"tools: at most {MAX_TOOLS_BYTES} bytes in all", param="tools")
    return tools


def parse_options(raw: dict[str, Any], names: set[str]) -> ToolOptions:
    data = {k: raw[k] for k in ("tool_choice", "max_tool_rounds") if k in raw}
    try:
        options = ToolOptions.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, prefix="") from None
    choice = options.tool_choice
    if isinstance(choice, NamedChoice) and choice.function.get("name") not in names:
        raise InvalidTools(
            "tool_choice: names no tool of this version", param="tool_choice.function.name"
        )
    if choice != "auto" and not names:
        raise InvalidTools("tool_choice: this version has no tools", param="tool_choice")
    return options


def _parse_one(i: int, item: Any) -> ToolIn:
    try:
        tool = ToolIn.model_validate(item)
    except ValidationError as exc:
        raise _invalid(exc, prefix=f"tools.{i}.") from None
    params = tool.function.parameters
    where = f"tools.{i}.function.parameters"
    if params is not None:
        if len(_compact(params)) > MAX_PARAMETERS_BYTES:
            raise InvalidTools(f"{where}: at most {MAX_PARAMETERS_BYTES} bytes", param=where)
        _check_schema(params, where)
    if isinstance(tool.source, WebhookSource):
        _check_url(tool.source.webhook, f"tools.{i}.source.webhook")
    return tool


def _check_schema(params: dict[str, Any], where: str) -> None:
    try:
        jsonschema_rs.meta.validate(params)
    except jsonschema_rs.ValidationError as exc:
        first = str(exc).split("\n", 1)[0]
        raise InvalidTools(f"{where}: not a JSON Schema: {first}", param=where) from None
    if params.get("type", "object") != "object":
        raise InvalidTools(f'{where}: must describe an object ("type": "object")', param=where)


def _check_url(url: str, where: str) -> None:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("https", "http") or not rest or " " in url:
        raise InvalidTools(f"{where}: must be an absolute https:// URL", param=where)


def _check_names(tools: list[ToolIn]) -> None:
    seen: set[str] = set()
    for i, t in enumerate(tools):
        if t.function.name in seen:
            where = f"tools.{i}.function.name"
            raise InvalidTools(f"{where}: {t.function.name!r} is declared twice", param=where)
        seen.add(t.function.name)


def _invalid(exc: ValidationError, prefix: str) -> InvalidTools:
    first = exc.errors()[0]
    param = prefix + ".".join(str(p) for p in first["loc"] if not isinstance(p, str) or p)
    msg = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
    return InvalidTools(f"{param.rstrip('.') or 'tools'}: {msg}", param=param.rstrip(".") or None)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def stored_tools(tools: list[ToolIn]) -> list[dict[str, Any]] | None:
    """The JSON kept in ``system_prompts.tools`` (None: a version without tools)."""
    return [t.model_dump(exclude_none=True) for t in tools] or None


def runtime_tools(stored: list[dict[str, Any]] | None) -> tuple[TenantTool, ...]:
    """The request path's view of a stored version's tools."""
    out = []
    for raw in stored or ():
        fn, source = raw["function"], raw.get("source") or {}
        out.append(
            TenantTool(
                name=fn["name"],
                description=fn.get("description"),
                parameters=fn.get("parameters"),
                webhook=source.get("webhook"),
                mcp=source.get("mcp"),
                status_text=raw.get("status_text"),
            )
        )
    return tuple(out)


def tools_digest(stored: list[dict[str, Any]] | None) -> dict[str, Any]:
    """What the audit log says about a version's tools: names and a hash, never schemas."""
    text = _compact(stored or [])
    return {
        "tools": [t["function"]["name"] for t in stored or ()],
        "tools_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
