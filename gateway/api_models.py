"""Pydantic models of the gateway's own JSON answers (chat completions, models, health, errors,
cache info), for the OpenAPI document (gateway/openapi.py).

The views build these bodies directly (the hot path does not validate its own output); the
schemathesis suite (tests/gateway/test_schemathesis.py) checks every answer against the
document, so a view and its model cannot drift apart unnoticed. Extra fields are allowed, as
in OpenAI's own answers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Out):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, ...")
    param: str | None = Field(description="the offending request field, when one applies")
    code: str | None = Field(description="a stable machine-readable reason")


class ErrorBody(_Out):
    """Every error answer (OpenAI's shape)."""

    error: ErrorDetail


class PromptTokensDetails(_Out):
    cached_tokens: int = Field(ge=0, description="prompt tokens served from the prefix cache")


class Usage(_Out):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(_Out):
    role: Literal["assistant"]
    content: str | None


class Choice(_Out):
    index: int = Field(ge=0)
    message: AssistantMessage
    finish_reason: str | None = Field(description="stop or length")
    logprobs: dict[str, object] | None


class ChatCompletion(_Out):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class ChunkDelta(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(_Out):
    index: int = Field(ge=0)
    delta: ChunkDelta
    finish_reason: str | None
    logprobs: dict[str, object] | None = None


class ChatCompletionChunk(_Out):
    """One ``data:`` event of a streamed answer; the stream ends with ``data: [DONE]``."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = Field(
        default=None, description="only on the last chunk, with stream_options.include_usage"
    )


class Model(_Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Out):
    object: Literal["list"]
    data: list[Model]


class Health(_Out):
    status: Literal["ok"]


class Readiness(_Out):
    ready: bool = Field(description="true when every check passes (then the status is 200)")
    checks: dict[str, bool] = Field(
        description="accepting (not shutting down), database, redis (when configured), "
        "engine, pins (start-up pinning done)"
    )


class CacheInfo(_Out):
    """A tenant's pinned prefix and prefix-cache counters (never the prompt or the salt)."""

    tenant_id: str
    prompt_version: int | None
    pin_state: str = Field(description="no_prompt, pinning, pinned, rejected or unpinned")
    pin_reason: str | None = None
    prefix_tokens: int | None = None
    pinned_blocks: int | None = None
    pinned_tokens: int | None = None
    inflight_requests: int | None = None
    retiring_versions: list[int | None] | None = None
    requests: int | None = None
    query_tokens: int | None = None
    hit_tokens: int | None = None
    hit_rate: float | None = None


class ClusterReport(_Out):
    """Workers, their health and load, and where each tenant's prompt is placed and pinned."""

    mode: Literal["in_process", "cluster"]
    workers: list[dict[str, object]]
    tenants: dict[str, dict[str, object]]
