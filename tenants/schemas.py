"""Pydantic request/response schemas of the admin API (extra fields are rejected).

Responses never include ``cache_salt``, key hashes or keys, except ``KeyCreated.key`` once.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tenants.errors import InvalidField
from tenants.tools import MAX_TOOL_ROUNDS, MAX_TOOLS, ToolChoiceIn, ToolIn

# Validation patterns are always applied with ``fullmatch``: in Python ``$`` also matches before
# a trailing newline, so ``match`` would accept "acme\n". They keep the ``^...$`` form because
# the tenant id's is published as a JSON Schema pattern (where ``$`` is the end of the text, as
# in pydantic-core's own regex engine).
# DNS-label-like slug: 2..63 chars of [a-z0-9-], starting and ending with a letter or digit.
TENANT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,61}[a-z0-9]$")
MAX_PROMPT_CHARS = 200_000
# Limits are INTEGER columns: a larger value would fail in the database, not in validation.
MAX_LIMIT = 2**31 - 1
MAX_WEIGHT = 1000.0  # a tenant's fair-share weight (engine/core/fairness.py)
Priority = Literal["interactive", "batch"]  # a key's class in the engine's scheduler
MAX_WIDGET_CHOICES = 128  # the chat API's own bound on n
ORIGIN_RE = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$")


def validate_tenant_id(value: str) -> str:
    if not TENANT_ID_RE.fullmatch(value):
        raise InvalidField(
            "tenant id must be 2-63 characters of lowercase letters, digits and hyphens, "
            "starting and ending with a letter or digit",
            param="id",
        )
    return value


class _In(BaseModel):
    # strict: "5" is not a number and true is not 1 here, as in the chat API's schemas
    model_config = ConfigDict(extra="forbid", strict=True, str_strip_whitespace=False)

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # PostgreSQL text cannot hold NUL; refuse it here on every backend alike.
        if isinstance(value, str) and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class LimitsIn(_In):
    rpm: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    tpm: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    weight: float | None = Field(
        default=None,
        gt=0,
        le=MAX_WEIGHT,
        description="fair share of the engine while tenants compete (null: 1)",
    )


class KeyLimitsIn(_In):
    """A key's own limits, applied within its tenant's (null: only the tenant's apply)."""

    rpm: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    tpm: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_LIMIT)


class TenantCreate(_In):
    # The pattern is published (OpenAPI); the validator below gives the readable error.
    id: str = Field(json_schema_extra={"pattern": TENANT_ID_RE.pattern})
    name: str = Field(min_length=1, max_length=200)
    system_prompt: str | None = Field(default=None, min_length=1, max_length=MAX_PROMPT_CHARS)
    limits: LimitsIn | None = None
    allow_client_system: bool = True

    @field_validator("id")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not TENANT_ID_RE.fullmatch(value):
            raise ValueError(
                "must be 2-63 characters of a-z, 0-9 and '-', not starting or ending with '-'"
            )
        return value


class TenantPatch(_In):
    name: str | None = Field(default=None, min_length=1, max_length=200)
    status: Literal["active", "suspended"] | None = None
    allow_client_system: bool | None = None
    conversation_store: bool | None = Field(
        default=None, description="false: every response is served with store off"
    )
    conversation_retention_days: int | None = Field(
        default=None,
        ge=0,
        le=36500,
        description="days a stored conversation is kept after its last turn; 0: the gateway's "
        "KVGATE_CONVERSATION_RETENTION_DAYS",
    )
    vllm_visitor_salt: bool | None = Field(
        default=None,
        description="on the vLLM backend, a cache salt per visitor: visitors isolated, the tenant "
        "prefix recomputed per visitor (kvgate's own engine ignores it: it already isolates them)",
    )


class PromptSet(_In):
    """PUT /tenants/{id}/system-prompt: a new version (text and tools together), made active.
    ``tools`` are checked first by tenants/tools.py (400 ``invalid_tools``). Omitted ``tools``,
    ``tool_choice`` and ``max_tool_rounds`` are the active version's (tenants/carry.py); null
    asks for the default."""

    text: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    tools: list[ToolIn] | None = Field(
        default=None,
        max_length=MAX_TOOLS,
        description="omitted: the active version's; [] or null: none",
    )
    tool_choice: ToolChoiceIn | None = Field(
        default=None,
        description="the choice of requests that send none (omitted: the active version's; "
        "null: auto)",
    )
    max_tool_rounds: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOOL_ROUNDS,
        description="gateway-run tool rounds (omitted: the active version's; null: 4)",
    )


class KeyPriorityIn(_In):
    """PUT /tenants/{id}/keys/{key_id}/priority: the engine's class of the key's requests."""

    priority: Priority


class KeyCreate(_In):
    kind: Literal["server", "widget"]
    allowed_origins: list[str] = Field(default_factory=list, max_length=50, validate_default=True)
    limits: KeyLimitsIn | None = None
    priority: Priority = "interactive"

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str], info: ValidationInfo) -> list[str]:
        # A widget key without an origin could never be used: refused at creation.
        if info.data.get("kind") == "widget" and not value:
            raise ValueError("a widget key needs at least one origin like https://example.com")
        for origin in value:
            if not ORIGIN_RE.fullmatch(origin):
                raise ValueError(f"{origin!r} is not an origin like https://example.com")
        return value


_ACCENT_RE = re.compile(r"^#[0-9a-fA-F]{3}([0-9a-fA-F]{3})?$")


class VisitorLimitsIn(_In):
    """Limits per end user of widget traffic (null: the gateway default)."""

    rpm: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    tpm: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_LIMIT)


class WidgetSettingsIn(_In):
    """PUT /tenants/{id}/widget: replaces every field (omitted: null / false)."""

    title: str | None = Field(default=None, min_length=1, max_length=200)
    greeting: str | None = Field(default=None, min_length=1, max_length=2000)
    accent: str | None = None
    require_session: bool = False
    allow_client_system: bool = False
    max_choices: int = Field(
        default=1,
        ge=1,
        le=MAX_WIDGET_CHOICES,
        description="the most choices (n) one widget chat request may ask for",
    )
    visitor_limits: VisitorLimitsIn | None = None
    history: bool = Field(
        default=False,
        description="keep each session-token visitor's conversation on the server",
    )

    @field_validator("accent")
    @classmethod
    def _accent(cls, value: str | None) -> str | None:
        if value is not None and not _ACCENT_RE.fullmatch(value):
            raise ValueError("must be a hex colour like #0b5fff or #06f")
        return value


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class LimitsOut(_Out):
    rpm: int | None
    tpm: int | None
    max_concurrency: int | None
    max_output_tokens: int | None
    weight: float | None = None


class KeyLimitsOut(_Out):
    rpm: int | None
    tpm: int | None
    max_concurrency: int | None


class KeyOut(_Out):
    id: str
    kind: str
    prefix: str
    allowed_origins: list[str]
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None
    limits: KeyLimitsOut
    priority: str = "interactive"

    @model_validator(mode="before")
    @classmethod
    def _limits_from_columns(cls, data: Any) -> Any:
        # An ``ApiKey`` row keeps its limits in three columns; the API nests them.
        if isinstance(data, dict) or hasattr(data, "limits"):
            return data
        fields = (*cls.model_fields.keys() - {"limits"},)
        out = {name: getattr(data, name) for name in fields}
        out["limits"] = {name: getattr(data, name) for name in KeyLimitsOut.model_fields}
        return out


class KeyList(_Out):
    data: list[KeyOut]


class KeyCreated(_Out):
    id: str
    kind: str
    prefix: str
    allowed_origins: list[str]
    limits: KeyLimitsOut
    key: str  # the only time the key is ever returned


class VisitorLimitsOut(_Out):
    rpm: int | None
    tpm: int | None
    max_concurrency: int | None


class WidgetSettingsOut(_Out):
    """A tenant's widget settings; the session secret only as whether one exists."""

    title: str | None
    greeting: str | None
    accent: str | None
    require_session: bool
    allow_client_system: bool
    max_choices: int
    visitor_limits: VisitorLimitsOut
    session_secret_set: bool
    history: bool


class TenantOut(_Out):
    id: str
    name: str
    status: str
    created_at: datetime
    updated_at: datetime
    allow_client_system: bool
    prompt_version: int | None
    limits: LimitsOut
    keys: list[KeyOut] | None = None
    conversation_store: bool = True
    conversation_retention_days: int | None = None
    vllm_visitor_salt: bool = False


class PromptOut(_Out):
    version: int
    text: str
    sha256: str
    created_at: datetime
    created_by: str
    active: bool
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    max_tool_rounds: int = 4


class PromptList(_Out):
    data: list[PromptOut]


class PromptVersion(_Out):
    """The answer of set-prompt: the new version, now active; ``webhook_secret`` once, when
    this version's webhook tools made the tenant's signing secret (docs/tools.md)."""

    version: int
    webhook_secret: str | None = None


class ToolSecret(_Out):
    """The tenant's new webhook signing secret (shown once)."""

    webhook_secret: str


class PromptActivated(_Out):
    """The answer of an activation: the version now active and the one it replaced."""

    version: int
    previous_version: int | None
    changed: bool  # false when the version was already active (nothing was written)


class AuditOut(_Out):
    id: int
    actor: str
    action: str
    tenant_id: str | None
    at: datetime
    details: dict[str, Any]


class TenantPage(_Out):
    data: list[TenantOut]
    next_cursor: str | None


class AuditPage(_Out):
    data: list[AuditOut]
    next_cursor: str | None


class RequestModel(_In):
    """The base of request schemas declared beside this module (tenants/admin_schemas.py)."""


class ResponseModel(_Out):
    """The base of response schemas declared beside this module."""


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Any) -> M:
    """Validate ``data``; the first error becomes ``InvalidField`` naming the dotted field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            msg = "unknown field"
        raise InvalidField(f"{param or 'body'}: {msg}", param=param) from None
