"""State of the admin sub-app, stored under ``ADMIN_CONTEXT``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tenants.store import TenantStore

# tenant id -> pin state and cache counters (any JSON-able mapping); may be sync or async.
CacheProvider = Callable[[str], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]
TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class PromptLimit:
    """How system prompts are bounded: ``count(text)`` tokens, at most ``max_tokens()``. Both
    are asked per request (the gateway's read the engine it opens after building the app)."""

    count: TokenCounter
    max_tokens: Callable[[], int]


@dataclass(frozen=True)
class AdminContext:
    store: TenantStore
    prompt_limit: PromptLimit | None
    cache_provider: CacheProvider | None
    actor: str


ADMIN_CONTEXT = web.AppKey("admin_context", AdminContext)
