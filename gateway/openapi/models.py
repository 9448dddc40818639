"""Pydantic models of the gateway's own JSON answers (models, health, errors, cache info,
cluster, widget config and sessions), for the OpenAPI document (gateway/openapi/document.py); the
chat answers' models are in gateway/chat/response_models.py.

The views build these bodies directly (the hot path does not validate its own output); the
schemathesis suite (tests/gateway/openapi/test_schemathesis.py) checks every answer against the
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


class WidgetConfig(_Out):
    """What a widget key's page shows (never secrets)."""

    title: str | None
    greeting: str | None
    accent: str | None
    require_session: bool
    history: bool = Field(description="the conversation is kept on the server (session tokens)")
    model: str


class WidgetMessage(_Out):
    role: Literal["user", "assistant"]
    content: str


class WidgetConversation(_Out):
    """A visitor's conversation kept on the server (``id`` null: none yet)."""

    id: str | None
    messages: list[WidgetMessage]


class ConversationDeleted(_Out):
    id: str
    object: Literal["conversation.deleted"]
    deleted: bool


class WidgetSession(_Out):
    """A signed session token for one end user on one origin."""

    token: str
    expires_at: int = Field(description="Unix time")
    expires_in: int = Field(description="seconds")
    origin: str
    end_user_id: str
