"""Pydantic models of the ledger's admin answers and bodies (the OpenAPI document; the views
build the answers directly, the schemathesis suite holds them to these)."""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

USD_PER_M = Field(ge=0, le=1_000_000, description="USD per million tokens")


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class UsageGroup(_Out):
    group: str = Field(description="the bucket (ISO 8601 UTC), key id, end user, model or tenant")
    requests: int
    prompt_tokens: int = Field(description="cached tokens included, as in OpenAI's usage")
    cached_tokens: int
    completion_tokens: int
    total_tokens: int
    spend_usd: float
    spend_nanos: int = Field(description="spend in nano-USD (exact)")


class UsageReport(_Out):
    object: Literal["usage_report"]
    tenant_id: str | None
    group_by: str
    start: str
    end: str
    data: list[UsageGroup]
    next_cursor: str | None


class UsageRecordOut(_Out):
    request_id: str
    at: str = Field(description="arrival, ISO 8601 UTC")
    tenant_id: str
    key_id: str | None
    end_user: str | None
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    choices: int
    stream: bool
    status: int
    outcome: str = Field(description="answered, refused, cancelled, shutdown or failed")
    error: str | None
    finish_reason: str | None
    ttft_ms: float | None
    duration_ms: float
    worker: str | None
    prompt_version: int | None
    spend_nanos: int
    tool_calls: int = Field(default=0, description="tenant tool calls the gateway ran")


class UsageRecordPage(_Out):
    object: Literal["list"]
    data: list[UsageRecordOut]
    next_cursor: str | None


class PriceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: Decimal = USD_PER_M
    cached_input: Decimal | None = Field(
        default=None, ge=0, le=1_000_000, description="default: the input price"
    )
    output: Decimal = USD_PER_M


class PriceOut(_Out):
    model: str
    input: float
    cached_input: float
    output: float
    source: Literal["config", "admin"]


class PriceList(_Out):
    object: Literal["list"]
    data: list[PriceOut]
