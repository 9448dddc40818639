"""Request and response shapes of ``POST /v1/chat/completions`` (OpenAI Chat Completions).

Requests are validated strictly (a string where a number belongs is a 400, not a coercion);
fields OpenAI defines that kvgate does not implement are ignored unless their value would change
the answer (``n`` other than 1 is rejected).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.errors import ApiError


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    @property
    def is_system(self) -> bool:
        return self.role in ("system", "developer")


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    n: int | None = None

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        items = [stop] if isinstance(stop, str) else stop or []
        if any(s == "" for s in items):
            raise ValueError("stop strings must not be empty")
        return stop

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


def parse_chat_request(body: bytes) -> ChatRequest:
    """Validate a request body; every failure becomes a 400 naming the offending field."""
    if not body.strip():
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        return ChatRequest.model_validate_json(body)
    except ValidationError as exc:
        raise _to_api_error(exc) from None


def _to_api_error(exc: ValidationError) -> ApiError:
    first = exc.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return ApiError(400, f"request body is not valid JSON: {first['msg']}")
    if first["type"] == "model_type":
        return ApiError(400, "request body must be a JSON object")
    param = _param(first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if param == "messages" and first["type"] == "too_short":
        msg = "messages must contain at least one message"
    elif param.endswith(".content") or ".content[" in param:
        msg = "content must be a string or an array of text parts"
    return ApiError(400, f"invalid value for {param}: {msg}", param=param or None)


def _param(loc: tuple[Any, ...]) -> str:
    # ("messages", 0, "content", "str") -> "messages[0].content"; union branch names dropped.
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[TextPart]", "list[str]", "int", "float", "bool") or "[" in part:
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


def completion_body(
    completion_id: str, model: str, text: str, finish_reason: str, usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage,
    }


def chunk_body(
    completion_id: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta=None`` is the usage-only chunk (choices: [])."""
    choices = []
    if delta is not None:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
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
