"""The admin API: an aiohttp sub-app mounted at ``ADMIN_PREFIX`` by the gateway."""

from __future__ import annotations

from aiohttp import web

from gateway.admin.app import ADMIN_PREFIX, create_admin_app
from gateway.admin.context import CacheProvider, PromptLimit
from gateway.admin.session import MemorySessionStore, SessionStore, SessionsUnavailable
from gateway.admin.session_redis import RedisSessionStore

# The console's sessions, on the gateway app (operators and tests may end them all).
ADMIN_SESSIONS: web.AppKey[SessionStore] = web.AppKey("admin_sessions")

__all__ = [
    "ADMIN_PREFIX",
    "ADMIN_SESSIONS",
    "CacheProvider",
    "MemorySessionStore",
    "PromptLimit",
    "RedisSessionStore",
    "SessionStore",
    "SessionsUnavailable",
    "create_admin_app",
]
