"""The limiter's script calls on pooled connections: pack, send, read, nothing else.

Two script calls run per chat request, so their cost is on every request's path. redis-py's
command layer adds ~40-70 us CPU to each on top of the round trip (pool lock, observability
hooks, and, with a socket timeout, an extra task per send through ``asyncio.wait_for``). Here the
connections are still redis-py's own (made by the client's pool class with the client's options:
URL, TLS, auth, db), but used directly and without a socket timeout: one ``asyncio.timeout``
covers connect, send and read together. A connection that failed, timed out or was cancelled
mid-call is closed, never reused (its reply may still be in flight).

A pooled connection that turns out dead (Redis restarted since it was last used) is retried
once on a new connection within the same deadline, so one restart costs no failed call per
stale connection. The retry is safe: the admission script is idempotent per lease id.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeout

MAX_IDLE = 32  # connections kept for reuse; more are made for bursts and closed after


class ScriptCalls:
    """EVALSHA of one script (EVAL with the source after NOSCRIPT, which caches it again)."""

    def __init__(self, client: aioredis.Redis, script: str) -> None:
        pool = client.connection_pool
        self._make = pool.connection_class
        self._kwargs = {**pool.connection_kwargs, "socket_timeout": None}
        self._timeout: float | None = pool.connection_kwargs.get("socket_timeout")
        self.script = script
        self.sha = hashlib.sha1(script.encode()).hexdigest()
        self._idle: list[AbstractConnection] = []

    async def run(self, keys: Sequence[str], args: Sequence[object]) -> Any:
        try:
            async with asyncio.timeout(self._timeout):
                if self._idle:
                    try:
                        return await self._run_on(self._idle.pop(), keys, args)
                    except (RedisConnectionError, ConnectionError):
                        pass  # stale: Redis closed it since; one more try on a new connection
                return await self._run_on(self._make(**self._kwargs), keys, args)
        except TimeoutError:
            raise RedisTimeout(f"no reply from Redis within {self._timeout} s") from None

    async def _run_on(
        self, conn: AbstractConnection, keys: Sequence[str], args: Sequence[object]
    ) -> Any:
        reusable = False
        try:
            reply = await self._call(conn, keys, args)
            reusable = True
            return reply
        finally:
            if reusable and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
            else:
                await conn.disconnect(nowait=True)

    async def _call(
        self, conn: AbstractConnection, keys: Sequence[str], args: Sequence[object]
    ) -> Any:
        if not conn.is_connected:
            await conn.connect()
        try:
            return await _roundtrip(conn, "EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:  # an error reply: the connection is still in step
            return await _roundtrip(conn, "EVAL", self.script, len(keys), *keys, *args)

    async def close(self) -> None:
        """Close the idle connections (also after an outage: they are stale); usable again."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect(nowait=True)


async def _roundtrip(conn: AbstractConnection, *command: Any) -> Any:
    await conn.send_packed_command(conn.pack_command(*command), check_health=False)
    return await conn.read_response()
