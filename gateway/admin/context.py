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
class AdminContext:
    store: TenantStore
    token_counter: TokenCounter | None
    max_prompt_tokens: int | None
    cache_provider: CacheProvider | None
    actor: str


ADMIN_CONTEXT = web.AppKey("admin_context", AdminContext)
