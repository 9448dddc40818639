"""The body of ``POST /v1/responses`` (OpenAI's ``CreateResponse``), validated strictly.

Fields kvgate does not do are refused with a 400 naming them (built-in tools, ``background``,
``reasoning``, ``include``, prompt templates, ``truncation: auto``); an unknown field is
refused as chat refuses one. ``input`` items are read by gateway/responses/items.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.chat.bounds import MAX_METADATA
from gateway.chat.tools.models import MAX_TOOLS, NAME_PATTERN
from gateway.errors import ApiError

FunctionName = Annotated[str, Field(pattern=NAME_PATTERN)]
MIN_OUTPUT_TOKENS = 16  # OpenAI's minimum of max_output_tokens (CreateResponse)


class _In(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FunctionTool(BaseModel):
    """``{"type": "function", "name", "description", "parameters", "strict"}``."""

    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(_In):
    type: Literal["function"]
    name: FunctionName


class TextFormat(BaseModel):
    """``text.format``: ``text``, ``json_object``, or ``json_schema`` (name, schema, strict)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    name: FunctionName | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextParam(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ConversationRef(_In):
    id: Annotated[str, Field(min_length=1, max_length=64)]


class ResponsesRequest(_In):
    model: Annotated[str, Field(min_length=1)]
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: Annotated[str, Field(max_length=64)] | None = None
    conversation: Annotated[str, Field(min_length=1, max_length=64)] | ConversationRef | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    max_output_tokens: Annotated[int, Field(ge=MIN_OUTPUT_TOKENS)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    text: TextParam | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: Annotated[dict[str, str], Field(max_length=MAX_METADATA)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    safety_identifier: Annotated[str, Field(max_length=256)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Declared so they are named when refused (any value but absent / null / false / empty).
    background: bool | None = None
    reasoning: Any = None
    include: list[Any] | None = None
    prompt: Any = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    moderation: Any = None
    context_management: Any = None

    @property
    def conversation_id(self) -> str | None:
        c = self.conversation
        return c.id if isinstance(c, ConversationRef) else c

    @property
    def end_user(self) -> str | None:
        return self.user or self.safety_identifier


_REFUSED = (
    ("background", "background responses are not supported"),
    ("reasoning", "this model does not reason; reasoning is not supported"),
    ("include", "include is not supported"),
    ("prompt", "prompt templates are not supported"),
    ("top_logprobs", "logprobs are not supported on /v1/responses"),
    ("moderation", "moderation is not supported"),
    ("context_management", "context management is not supported"),
)


def unsupported(param: str, what: str) -> ApiError:
    return ApiError(400, f"{param}: {what}", param=param, code="unsupported_parameter")


def _refusal(req: ResponsesRequest) -> ApiError | None:
    for name, what in _REFUSED:
        value = getattr(req, name)
        if value not in (None, False, [], {}):
            return unsupported(name, what)
    if req.truncation == "auto":
        return unsupported("truncation", "only 'disabled' is supported")
    if req.previous_response_id is not None and req.conversation is not None:
        return ApiError(
            400,
            "previous_response_id and conversation cannot be used together",
            param="previous_response_id",
        )
    for i, tool in enumerate(req.tools or []):
        kind = tool.get("type")
        if kind != "function":
            name = str(kind)[:40] if isinstance(kind, str) else "non-function"
            return unsupported(
                f"tools[{i}].type", f"tools of type {name!r} are not supported (function only)"
            )
    return None


def parse_responses_request(body: bytes) -> ResponsesRequest:
    if not body.strip():
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        req = ResponsesRequest.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    refused = _refusal(req)
    if refused is not None:
        raise refused
    return req


def function_tools(req: ResponsesRequest) -> list[FunctionTool]:
    out = []
    for i, tool in enumerate(req.tools or []):
        try:
            out.append(FunctionTool.model_validate(tool))
        except ValidationError as exc:
            raise validation_error(exc, f"tools[{i}]") from None
    return out


def validation_error(exc: ValidationError, where: str = "") -> ApiError:
    first = exc.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return ApiError(400, f"request body is not valid JSON: {first['msg']}")
    if first["type"] == "model_type" and not where:
        return ApiError(400, "request body must be a JSON object")
    loc = [str(p) if not isinstance(p, int) else f"[{p}]" for p in first["loc"]]
    param = where
    for part in loc:
        param += part if part.startswith("[") else (f".{part}" if param else part)
    if first["type"] == "extra_forbidden" and len(first["loc"]) == 1 and not where:
        return ApiError(
            400,
            f"Unrecognized request argument supplied: {param[:64]}",
            param=param[:64],
            code="unknown_parameter",
        )
    msg = first["msg"].removeprefix("Value error, ")
    return ApiError(400, f"invalid value for {param}: {msg}", param=param or None)
