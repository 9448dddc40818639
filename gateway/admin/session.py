"""Console sessions: an admin token exchanged for an HttpOnly cookie plus a CSRF token.

``POST /v1/session {token}`` -> ``{csrf_token, principal, idle_s, max_s}`` and the cookie
``kvgate_admin`` (HttpOnly, SameSite=Strict, Path=/admin, Secure unless the gateway is reached
on loopback). Every request the cookie authenticates that is not a GET/HEAD must carry the CSRF
token in ``X-CSRF-Token``. A session ends ``idle_s`` after its last request, ``max_s`` after
sign-in, at ``DELETE /v1/session``, or as soon as its token is revoked or expires (each request
re-resolves the token's digest; the token itself is not kept).

Where sessions live (one ``SessionStore`` interface, two stores):

- ``RedisSessionStore`` (gateway/admin/session_redis.py) when the gateway has Redis
  (``KVGATE_REDIS_URL``): every replica sees every session, so a sign-in, sign-out or expiry
  on one replica holds on all of them (no session affinity needed).
- ``MemorySessionStore`` otherwise (the zero-config ``kvgate serve``): the memory of this
  process (a restart signs everyone out).

Ids are 256 random bits, kept only by their SHA-256. A store that cannot answer treats the
session as absent (401: the console goes back to sign-in), never as valid.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
import time
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

COOKIE = "kvgate_admin"
CSRF_HEADER = "X-CSRF-Token"
MAX_SESSIONS = 10_000  # of the memory store


@dataclass(frozen=True)
class Session:
    digest: str  # SHA-256 of the admin token it was opened with
    principal_id: str
    csrf: str
    started: float  # sign-in time, on the store's clock (memory: monotonic; Redis: wall)


class SessionsUnavailable(Exception):
    """The store cannot open or end a session now (its Redis is unreachable)."""


class SessionStore(Protocol):
    idle_s: float
    max_s: float

    async def open(self, digest: str, principal_id: str) -> tuple[str, Session]:
        """A new session: (cookie value, session). Raises ``SessionsUnavailable``."""
        ...

    async def get(self, sid: str) -> Session | None:
        """The live session of cookie value ``sid`` (its idle clock restarts); None when it
        is unknown, expired, or the store cannot answer (fail closed)."""
        ...

    async def close(self, sid: str) -> None:
        """End the session (no-op when unknown). Raises ``SessionsUnavailable``."""
        ...

    async def expire_all(self) -> None:
        """End every session of this gateway (an operator's or a test's lever)."""
        ...

    async def aclose(self) -> None:
        """Release the store's connections (the app's clean-up)."""
        ...


def session_key(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


def new_session(digest: str, principal_id: str, started: float) -> tuple[str, Session]:
    return secrets.token_urlsafe(32), Session(
        digest, principal_id, secrets.token_urlsafe(32), started
    )


class MemorySessionStore:
    """Sessions in this process: digest of the id -> (session, last seen, monotonic)."""

    def __init__(self, idle_s: float = 1800.0, max_s: float = 43200.0) -> None:
        self.idle_s = idle_s
        self.max_s = max_s
        self._sessions: dict[str, tuple[Session, float]] = {}

    async def open(self, digest: str, principal_id: str) -> tuple[str, Session]:
        now = time.monotonic()
        if len(self._sessions) >= MAX_SESSIONS:
            self._sweep(now)
        if len(self._sessions) >= MAX_SESSIONS:  # still full: the oldest goes
            del self._sessions[min(self._sessions, key=lambda k: self._sessions[k][0].started)]
        sid, session = new_session(digest, principal_id, now)
        self._sessions[session_key(sid)] = (session, now)
        return sid, session

    async def get(self, sid: str) -> Session | None:
        key, now = session_key(sid), time.monotonic()
        entry = self._sessions.get(key)
        if entry is None:
            return None
        if self._expired(entry, now):
            del self._sessions[key]
            return None
        self._sessions[key] = (entry[0], now)
        return entry[0]

    async def close(self, sid: str) -> None:
        self._sessions.pop(session_key(sid), None)

    async def expire_all(self) -> None:
        self._sessions.clear()

    async def aclose(self) -> None:
        """Nothing to release (the sessions outlive it: tests reuse a store)."""

    def _expired(self, entry: tuple[Session, float], now: float) -> bool:
        session, seen = entry
        return now - seen >= self.idle_s or now - session.started >= self.max_s

    def _sweep(self, now: float) -> None:
        for key in [k for k, e in self._sessions.items() if self._expired(e, now)]:
            del self._sessions[key]


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _loopback(request: web.Request) -> bool:
    """Reached on loopback from loopback (a proxy on this host forwards a public Host)."""
    return _is_loopback(request.url.host or "") and _is_loopback(request.remote or "")


def set_cookie(response: web.StreamResponse, request: web.Request, sid: str) -> None:
    """A browser-session cookie (no Max-Age): the server's clocks decide when it ends."""
    response.set_cookie(
        COOKIE,
        sid,
        path="/admin",
        httponly=True,
        samesite="Strict",
        secure=not _loopback(request),
    )


def clear_cookie(response: web.StreamResponse) -> None:
    response.del_cookie(COOKIE, path="/admin")
