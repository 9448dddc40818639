"""Read paths the gateway calls per request and at start-up (each takes an ``AsyncSession``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import ColumnElement, Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.keys import key_matches, key_prefix
from tenants.models import ApiKey, SystemPrompt, Tenant
from tenants.settings import DEFAULT_LIMITS, Limits
from tenants.tools import DEFAULT_TOOL_ROUNDS, TenantTool, runtime_tools


@dataclass(frozen=True)
class KeyIdentity:
    tenant_id: str
    key_id: str
    kind: str  # "server" | "widget"
    allowed_origins: tuple[str, ...]
    # The key's own limits (api_keys.rpm / tpm / max_concurrency), checked besides the
    # tenant's; None: the key has no limit of its own on that dimension.
    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None
    priority: Literal["interactive", "batch"] = "interactive"  # the engine's class of its requests


@dataclass(frozen=True)
class WidgetPolicy:
    """The tenant's widget settings: what the request path enforces, and what the public config
    route shows (served from the cached runtime, so a page view costs no database read)."""

    require_session: bool = False  # bare widget keys are refused; session tokens only
    allow_client_system: bool = False  # widget traffic may send system/developer messages
    max_choices: int = 1  # the most choices (n) one widget chat request may ask for
    session_secret: str | None = field(default=None, repr=False)  # HMAC key of session tokens
    title: str | None = None
    greeting: str | None = None
    accent: str | None = None
    history: bool = False  # session-token visitors' conversations kept on the server


@dataclass(frozen=True)
class ToolPolicy:
    """The active version's tools and how the gateway uses them (tenants/tools.py)."""

    tools: tuple[TenantTool, ...] = ()
    # The choice of requests that send none (the widget's): a mode or a named function.
    tool_choice: Literal["auto", "required", "none"] | dict[str, Any] = "auto"
    max_rounds: int = DEFAULT_TOOL_ROUNDS  # rounds of gateway-run tools per turn


@dataclass(frozen=True)
class ConversationPolicy:
    """Stored responses and conversations (tenants.conversation_*)."""

    store: bool = True  # False: every request is served with ``store`` off
    retention_days: int | None = None  # None: the gateway's KVGATE_CONVERSATION_RETENTION_DAYS


@dataclass(frozen=True)
class TenantRuntime:
    """Everything the request path needs about a tenant. ``limits`` are resolved (no None)."""

    tenant_id: str
    status: str
    cache_salt: str = field(repr=False)  # secret engine namespace: never log or return it
    prompt_version: int | None
    prompt_text: str | None = field(repr=False)
    limits: Limits
    allow_client_system: bool
    widget: WidgetPolicy = WidgetPolicy()
    # Per-visitor limits of widget traffic (tenants.visitor_*); None: the gateway's default.
    visitor_limits: Limits = field(default_factory=Limits)
    tool_policy: ToolPolicy = ToolPolicy()
    conversations: ConversationPolicy = ConversationPolicy()
    # vLLM backend: a cache salt per visitor, not the tenant's (gateway/chat/cache_scope.py)
    vllm_visitor_salt: bool = False


async def authenticate_key(session: AsyncSession, secret: str) -> KeyIdentity | None:
    """Identity of a presented key, or None when malformed, unknown, revoked, or the tenant is
    deleted. Suspended tenants still authenticate: the caller decides (via the runtime status)."""
    prefix = key_prefix(secret)
    if prefix is None:
        return None
    row = await _key_row(session, ApiKey.prefix == prefix)
    if row is None:
        return None
    key, status = row
    # Compare before any other check so the timing does not depend on revocation state.
    if not key_matches(secret, key.secret_sha256):
        return None
    return _live_identity(key, status)


async def key_identity(session: AsyncSession, key_id: str) -> KeyIdentity | None:
    """A key by its id (e.g. the issuer named by a widget session token), or None when unknown,
    revoked, or its tenant is deleted."""
    row = await _key_row(session, ApiKey.id == key_id)
    return None if row is None else _live_identity(*row)


async def _key_row(session: AsyncSession, where: ColumnElement[bool]) -> tuple[ApiKey, str] | None:
    """The one key matching ``where`` with its tenant's status, or None."""
    stmt = select(ApiKey, Tenant.status).join(Tenant, Tenant.id == ApiKey.tenant_id).where(where)
    row = (await session.execute(stmt)).first()
    return None if row is None else (row[0], row[1])


def _live_identity(key: ApiKey, tenant_status: str) -> KeyIdentity | None:
    """The key's identity unless it is revoked or its tenant deleted."""
    if key.revoked_at is not None or tenant_status == "deleted":
        return None
    return _identity(key)


def _identity(key: ApiKey) -> KeyIdentity:
    return KeyIdentity(
        tenant_id=key.tenant_id,
        key_id=key.id,
        kind=key.kind,
        allowed_origins=tuple(key.allowed_origins or ()),
        rpm=key.rpm,
        tpm=key.tpm,
        max_concurrency=key.max_concurrency,
        priority="batch" if key.priority == "batch" else "interactive",
    )


def _tool_policy(prompt: SystemPrompt | None) -> ToolPolicy:
    options = (prompt.tool_options if prompt is not None else None) or {}
    return ToolPolicy(
        tools=runtime_tools(prompt.tools if prompt is not None else None),
        tool_choice=options.get("tool_choice", "auto"),
        max_rounds=options.get("max_tool_rounds", DEFAULT_TOOL_ROUNDS),
    )


def _runtime(tenant: Tenant, prompt: SystemPrompt | None, defaults: Limits) -> TenantRuntime:
    raw = Limits(
        tenant.rpm, tenant.tpm, tenant.max_concurrency, tenant.max_output_tokens, tenant.weight
    )
    return TenantRuntime(
        tenant_id=tenant.id,
        status=tenant.status,
        cache_salt=tenant.cache_salt,
        prompt_version=tenant.active_prompt_version,
        prompt_text=prompt.text if prompt is not None else None,
        limits=raw.resolve(defaults),
        allow_client_system=tenant.allow_client_system,
        widget=WidgetPolicy(
            require_session=tenant.widget_require_session,
            allow_client_system=tenant.widget_allow_client_system,
            max_choices=tenant.widget_max_choices,
            session_secret=tenant.widget_session_secret,
            title=tenant.widget_title,
            greeting=tenant.widget_greeting,
            accent=tenant.widget_accent,
            history=tenant.widget_history,
        ),
        visitor_limits=Limits(
            tenant.visitor_rpm, tenant.visitor_tpm, tenant.visitor_max_concurrency
        ),
        tool_policy=_tool_policy(prompt),
        conversations=ConversationPolicy(
            store=tenant.conversation_store, retention_days=tenant.conversation_retention_days
        ),
        vllm_visitor_salt=tenant.vllm_visitor_salt,
    )


def _with_prompt() -> Select[Tenant, SystemPrompt | None]:
    return select(Tenant, SystemPrompt).outerjoin(
        SystemPrompt,
        (SystemPrompt.tenant_id == Tenant.id)
        & (SystemPrompt.version == Tenant.active_prompt_version),
    )


async def get_tenant_runtime(
    session: AsyncSession, tenant_id: str, defaults: Limits = DEFAULT_LIMITS
) -> TenantRuntime | None:
    """The tenant's runtime view in any status (the caller rejects non-active), or None."""
    row = (await session.execute(_with_prompt().where(Tenant.id == tenant_id))).first()
    if row is None:
        return None
    return _runtime(row[0], row[1], defaults)


async def list_active_runtimes(
    session: AsyncSession, defaults: Limits = DEFAULT_LIMITS
) -> list[TenantRuntime]:
    """Runtime views of every active tenant, ordered by id (for pinning at start-up)."""
    rows = await session.execute(
        _with_prompt().where(Tenant.status == "active").order_by(Tenant.id)
    )
    return [_runtime(t, prompt, defaults) for t, prompt in rows]
