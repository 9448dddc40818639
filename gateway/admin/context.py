"""State of the admin sub-app, stored under ``ADMIN_CONTEXT``; the calling principal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.admin.principal import Principal, PrincipalCache
from gateway.admin.session import Session, SessionStore
from gateway.admin.throttle import AdminThrottle
from tenants.runtime import ToolPolicy
from tenants.store import TenantStore

# tenant id -> pin state and cache counters (any JSON-able mapping); may be sync or async.
CacheProvider = Callable[[str], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]
# A version's prefix tokens (its text and tools through the chat template): CPU-bound, called
# on the tokenize pool's threads (gateway/admin/prompts.py).
TokenCounter = Callable[[str, ToolPolicy], int]

# The principal of the admin request being handled (set by gateway/admin/auth.py for the
# handler's task only): audit rows name it.
CURRENT_PRINCIPAL: ContextVar[Principal | None] = ContextVar("admin_principal", default=None)
PRINCIPAL = web.RequestKey("admin_principal", Principal)
# The console session the cookie of this request opened (absent for bearer tokens).
SESSION = web.RequestKey("admin_session", Session)


@dataclass(frozen=True)
class PromptLimit:
    """How system prompts are bounded: ``count(text, tools)`` tokens, at most ``max_tokens()``.
    Both are asked per request (the gateway's read the engine it opens after building the
    app)."""

    count: TokenCounter
    max_tokens: Callable[[], int]


@dataclass(frozen=True)
class AdminContext:
    store: TenantStore
    prompt_limit: PromptLimit | None
    cache_provider: CacheProvider | None
    default_actor: str
    principals: PrincipalCache
    sessions: SessionStore
    throttle: AdminThrottle

    @property
    def actor(self) -> str:
        """Who writes the audit row: the calling principal's id (else ``default_actor``)."""
        principal = CURRENT_PRINCIPAL.get()
        return principal.id if principal is not None else self.default_actor


ADMIN_CONTEXT = web.AppKey("admin_context", AdminContext)
