"""Request and response shapes of ``POST /v1/chat/completions`` (OpenAI Chat Completions).

Requests are validated strictly (a string where a number belongs is a 400, not a coercion).
Unknown top-level fields are refused as OpenAI refuses them ("Unrecognized request argument
supplied: X"); fields OpenAI defines that kvgate does not implement are declared, so the OpenAPI
document lists them, and refused with a 400 naming the parameter when their value would change
the answer (the deprecated ``functions`` / ``function_call``, audio, predicted outputs,
reasoning effort, web search, stored completions); the rest (``metadata``, ``service_tier``)
are accepted and have no effect. Tools and structured outputs (``tools``, ``tool_choice``,
``parallel_tool_calls``, ``response_format``) are gateway/chat/tools/'s. ``top_k``, ``min_p``
and ``repetition_penalty`` are kvgate extensions (vLLM's names). The size bounds of a request
(stop strings, logit bias, seed, logprobs) are in ``gateway/chat/bounds.py``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.chat.bounds import (
    MAX_CHOICES,
    MAX_LOGIT_BIAS,
    MAX_MESSAGES,
    MAX_METADATA,
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_TOP_LOGPROBS,
    SEED_MAX,
    SEED_MIN,
    parse_token_id,
)
from gateway.chat.messages import ChatMessage
from gateway.chat.shape import check_shape
from gateway.chat.tools.checks import check_tool_fields
from gateway.chat.tools.models import MAX_TOOLS, ResponseFormat, ToolChoice, ToolDef
from gateway.errors import ApiError


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class ChatRequest(BaseModel):
    """The body of ``POST /v1/chat/completions``."""

    model_config = ConfigDict(strict=True, extra="forbid")
    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    stop: str | list[str] | None = Field(
        default=None,
        description=f"up to {MAX_STOP_SEQUENCES} sequences of 1..{MAX_STOP_CHARS} characters",
    )
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = Field(
        default=None,
        description=f"token id (as a string) -> bias in [-100, 100]; at most {MAX_LOGIT_BIAS}",
        json_schema_extra={"maxProperties": MAX_LOGIT_BIAS},
    )
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Annotated[str, Field(max_length=256)] | None = Field(
        default=None, description="end-user id: logged, and the visitor of per-user limits"
    )
    # kvgate extensions (vLLM's names)
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    # Tool calling and structured outputs (gateway/chat/tools/).
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = Field(
        default=None,
        description='"none", "auto" (the default with tools), "required" or a named function',
    )
    parallel_tool_calls: bool | None = Field(default=None, description="default true")
    response_format: ResponseFormat | None = Field(
        default=None, description='{"type": "text" | "json_object" | "json_schema", ...}'
    )
    # Accepted, no effect.
    metadata: Annotated[dict[str, str], Field(max_length=MAX_METADATA)] | None = None
    service_tier: str | None = None
    # Declared so the document lists them; refused unless absent / empty / the default.
    functions: list[Any] | None = Field(default=None, description="deprecated; not supported: 400")
    function_call: Any = Field(default=None, description="deprecated; not supported: 400")
    modalities: list[str] | None = Field(default=None, description='only ["text"]')
    audio: Any = Field(default=None, description="not supported: 400")
    prediction: Any = Field(default=None, description="not supported: 400")
    reasoning_effort: Any = Field(default=None, description="not supported: 400")
    web_search_options: Any = Field(default=None, description="not supported: 400")
    store: bool | None = Field(default=None, description="stored completions: only false")

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        items = [stop] if isinstance(stop, str) else stop or []
        if len(items) > MAX_STOP_SEQUENCES:
            raise ValueError(
                f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed, got {len(items)}"
            )
        if any(s == "" for s in items):
            raise ValueError("stop sequences must not be empty")
        longest = max((len(s) for s in items), default=0)
        if longest > MAX_STOP_CHARS:
            raise ValueError(
                f"a stop sequence may have at most {MAX_STOP_CHARS} characters, got {longest}"
            )
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _check_bias_size(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias is not None and len(bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} entries are allowed, got {len(bias)}")
        return bias

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def num_choices(self) -> int:
        return self.n or 1

    @property
    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None (not asked) or the number of alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def bias(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` with integer keys (checked by ``check_semantics``), one entry per
        token ("5" and "05" name one token: the later entry wins, as for repeated JSON keys)."""
        out: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            token = parse_token_id(key)
            assert token is not None, "logit_bias keys are checked by check_semantics"
            out[token] = value
        return tuple(out.items())


def parse_chat_request(
    body: bytes, max_messages: int = MAX_MESSAGES, declared: Sequence[str] = ()
) -> ChatRequest:
    """Validate a request body; every failure becomes a 400 naming the offending field.
    The sizes of its collections are checked first (gateway/chat/shape.py). ``declared``: the
    names of the tenant's own tools (a choice may name them; the client's may not reuse them)."""
    if not body.strip():
        raise ApiError(400, "request body is empty; expected a JSON object")
    check_shape(body, ChatRequest.model_fields, max_messages)
    try:
        req = ChatRequest.model_validate_json(body)
    except ValidationError as exc:
        raise _to_api_error(exc) from None
    check_semantics(req, declared)
    return req


def _unsupported(param: str, what: str) -> ApiError:
    return ApiError(400, f"{param}: {what}", param=param, code="unsupported_parameter")


def _refused_field(req: ChatRequest) -> ApiError | None:
    """The first field set to something kvgate does not do."""
    for name in ("functions", "function_call"):
        if getattr(req, name) is not None:
            return _unsupported(
                name, "the deprecated function calling is not supported; use tools and tool_choice"
            )
    if req.modalities is not None and req.modalities != ["text"]:
        return _unsupported("modalities", "only ['text'] output is supported")
    for name, what in (
        ("audio", "audio output is not supported"),
        ("prediction", "predicted outputs are not supported"),
        ("reasoning_effort", "this model does not reason; reasoning_effort is not supported"),
        ("web_search_options", "web search is not supported"),
    ):
        if getattr(req, name) is not None:
            return _unsupported(name, what)
    if req.store:
        return _unsupported("store", "stored completions are not supported")
    return None


def check_semantics(req: ChatRequest, declared: Sequence[str] = ()) -> None:
    """Rules between fields, and values pydantic's types do not express."""
    refused = _refused_field(req)
    if refused is not None:
        raise refused
    check_tool_fields(req.tools or [], req.tool_choice, req.response_format, req.messages, declared)
    if (
        req.max_tokens is not None
        and req.max_completion_tokens is not None
        and req.max_tokens != req.max_completion_tokens
    ):
        raise ApiError(
            400,
            "max_tokens and max_completion_tokens disagree; max_completion_tokens is the newer "
            "name of max_tokens, send one of them",
            param="max_completion_tokens",
        )
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    for key, bias in (req.logit_bias or {}).items():
        token = parse_token_id(key)
        if token is None:
            raise ApiError(
                400,
                f"invalid key in logit_bias: {key[:32]!r}; keys are token ids as strings",
                param="logit_bias",
            )
        if not -100.0 <= bias <= 100.0:
            raise ApiError(
                400,
                f"invalid value in logit_bias for token {token}: {bias}; must be in [-100, 100]",
                param="logit_bias",
            )


def _to_api_error(exc: ValidationError) -> ApiError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return ApiError(400, f"request body is not valid JSON: {first['msg']}")
    if first["type"] == "model_type":
        return ApiError(400, "request body must be a JSON object")
    unknown = [e for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 1]
    if unknown:
        name = str(unknown[0]["loc"][0])
        return ApiError(
            400,
            f"Unrecognized request argument supplied: {name[:64]}",
            param=name[:64],
            code="unknown_parameter",
        )
    part = _content_part_error(errors)
    if part is not None:
        return part
    param = _param(first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if param == "messages" and first["type"] == "too_short":
        msg = "messages must contain at least one message"
    elif param.endswith(".content") or ".content[" in param:
        msg = "content must be a string or an array of text parts"
    return ApiError(400, f"invalid value for {param}: {msg}", param=param or None)


def _content_part_error(errors: list[Any]) -> ApiError | None:
    """A content part of another type than text (image, audio, file): named, with its type."""
    for e in errors:
        loc = e["loc"]
        if (
            e["type"] == "literal_error"
            and len(loc) > 3
            and loc[2] == "content"
            and loc[-1] == "type"
        ):
            kind = e["input"] if isinstance(e["input"], str) else "non-text"
            param = _param(loc[:-1])
            return ApiError(
                400,
                f"{param}: content parts of type {kind[:32]!r} are not supported; this model "
                "reads text only",
                param=param,
                code="unsupported_content",
            )
    return None


# Names pydantic puts in an error's location for the branch of a union that failed.
_UNION_BRANCHES = frozenset(
    ("str", "list[TextPart]", "list[str]", "int", "float", "bool", "NamedToolChoice")
)


def _param(loc: tuple[Any, ...]) -> str:
    # ("messages", 0, "content", "str") -> "messages[0].content"; union branch names dropped.
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _UNION_BRANCHES or "[" in part:
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def usage_body(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def choice_body(
    index: int,
    text: str | None,
    finish_reason: str,
    logprobs: dict[str, Any] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "index": index,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": logprobs,
    }


def completion_body(
    completion_id: str, model: str, choices: list[dict[str, Any]], usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def chunk_body(
    completion_id: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    *,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta=None`` is the usage-only chunk (choices: [])."""
    choices = []
    if delta is not None:
        choices = [
            {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
        ]
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return body
