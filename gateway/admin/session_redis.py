"""Console sessions in Redis, shared by every gateway replica (see gateway/admin/session.py).

One key per session, under the gateway's Redis prefix (``KVGATE_REDIS_PREFIX``)::

    {prefix}admin:session:<SHA-256 of the session id>   JSON {digest, principal_id, csrf, started}

The key's TTL is the idle expiry: set at sign-in, restarted by every request (``GETEX``), so
Redis ends an idle session on all replicas at once. The absolute expiry is checked against
``started``, wall-clock seconds (monotonic clocks differ between hosts). Sign-out deletes the
key; ``expire_all`` deletes this gateway's session keys only (SCAN by its prefix, never FLUSH).

Redis unreachable: ``get`` answers None (the request is refused with 401 and the console
goes back to sign-in; never a 500), logged once per outage; ``open`` and ``close`` raise
``SessionsUnavailable`` (the views answer 503).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from gateway.admin.session import Session, SessionsUnavailable, new_session, session_key

T = TypeVar("T")
log = structlog.get_logger(__name__)
DELETE_BATCH = 500


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _encode(s: Session) -> str:
    return json.dumps(
        {"digest": s.digest, "principal_id": s.principal_id, "csrf": s.csrf, "started": s.started}
    )


def _decode(raw: bytes | str) -> Session | None:
    try:
        d = json.loads(raw)
        return Session(
            str(d["digest"]), str(d["principal_id"]), str(d["csrf"]), float(d["started"])
        )
    except (ValueError, KeyError, TypeError):  # not a key this store wrote: no session
        return None


class RedisSessionStore:
    def __init__(
        self, client: aioredis.Redis, prefix: str, idle_s: float = 1800.0, max_s: float = 43200.0
    ) -> None:
        """``client``: the gateway's Redis (``gateway.ratelimit.redis.make_client``: short
        timeouts); it belongs to this store from now on (``aclose``)."""
        self.client = client
        self.idle_s = idle_s
        self.max_s = max_s
        self.base = f"{prefix}admin:session:"
        self._down = False  # an outage is logged once, at its start

    def key(self, sid: str) -> str:
        return self.base + session_key(sid)

    async def open(self, digest: str, principal_id: str) -> tuple[str, Session]:
        sid, session = new_session(digest, principal_id, time.time())
        ttl_ms = math.ceil(min(self.idle_s, self.max_s) * 1000)
        await self._call(lambda: self.client.set(self.key(sid), _encode(session), px=ttl_ms))
        return sid, session

    async def get(self, sid: str) -> Session | None:
        key = self.key(sid)
        ttl_ms = math.ceil(self.idle_s * 1000)
        try:
            raw = await self._call(lambda: self.client.getex(key, px=ttl_ms))
        except SessionsUnavailable:
            return None  # fail closed
        session = _decode(raw) if raw is not None else None
        if session is not None and time.time() - session.started >= self.max_s:
            await self._quiet_delete(key)
            return None
        return session

    async def close(self, sid: str) -> None:
        await self._call(lambda: self.client.delete(self.key(sid)))

    async def expire_all(self) -> None:
        await self._call(self._delete_all)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def _delete_all(self) -> int:
        batch: list[bytes] = []
        deleted = 0
        async for key in self.client.scan_iter(match=_glob_escape(self.base) + "*", count=500):
            batch.append(key)
            if len(batch) >= DELETE_BATCH:
                deleted += await self.client.delete(*batch)
                batch.clear()
        if batch:
            deleted += await self.client.delete(*batch)
        return deleted

    async def _quiet_delete(self, key: str) -> None:
        with contextlib.suppress(SessionsUnavailable):  # the key's idle TTL ends it anyway
            await self._call(lambda: self.client.delete(key))

    async def _call(self, command: Callable[[], Awaitable[T]]) -> T:
        try:
            result = await command()
        except RedisError as exc:
            if not self._down:
                self._down = True
                log.warning("admin_sessions_redis_down", error=f"{type(exc).__name__}: {exc}")
            raise SessionsUnavailable("console sessions are unavailable (Redis)") from exc
        if self._down:
            self._down = False
            log.info("admin_sessions_redis_up")
        return result
