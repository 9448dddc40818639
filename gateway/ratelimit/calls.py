"""The limiter's script calls, through redis-py's command API (``Redis.evalsha`` / ``eval``).

Two script calls run per chat request, so their cost is on every request's path. They run on a
client of their own (``make_script_client``, from the limiter's URL), configured for that path:

* **One deadline.** No socket timeout (redis-py's adds an ``asyncio.wait_for`` per send and a
  timeout scope per read, ~70 us a call on Python 3.11); one ``asyncio.timeout`` covers the wait
  for a connection, connect, send and read together.
* **Bounded connections.** At most ``MAX_CONNECTIONS`` calls are in flight (a semaphore in front
  of the pool, so the pool never holds more connections than that); a burst waits for a
  connection within its deadline instead of opening a socket per call.
* **A stale connection is retried once.** A pooled connection that Redis closed since its last
  use (a restart) fails with ``ConnectionError``; redis-py's ``Retry`` (one retry, no backoff,
  connection errors only) reconnects it and sends the call again, within the same deadline, so
  one restart costs no failed call per stale connection. The retry is safe: every mode of the
  script is idempotent per lease id (script.py).
* **A call interrupted mid-way is never read by the next one.** A timeout or cancellation
  interrupts redis-py inside send or read, which disconnect the connection on any exception
  before the pool takes it back; its next user connects again, so a late reply is never read as
  the answer to another call.

NOSCRIPT (Redis restarted or SCRIPT FLUSH) falls back to EVAL with the source, which also caches
the script again: one round trip more, once.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeout
from redis.maint_notifications import MaintNotificationsConfig

MAX_CONNECTIONS = 32  # script calls in flight at once, and so connections held
ScriptArg = str | int | float  # what the script takes in ARGV (redis-py encodes each)


def make_script_client(url: str, timeout_s: float) -> aioredis.Redis:
    """The client ``ScriptCalls`` runs on (see the module docstring)."""
    return aioredis.Redis.from_url(
        url,
        socket_timeout=None,  # the deadline of ``ScriptCalls.run`` instead
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1, (RedisConnectionError,)),
        max_connections=MAX_CONNECTIONS,
        # Redis Enterprise's maintenance hints (relaxed timeouts while a shard moves) are for
        # clients that wait; this one fails over instead. Off, each call is ~10 us cheaper.
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
    )


class ScriptCalls:
    """EVALSHA of one script (EVAL with the source after NOSCRIPT, which caches it again), each
    call under one deadline of ``timeout_s``."""

    def __init__(self, client: aioredis.Redis, script: str, timeout_s: float | None) -> None:
        self.redis = client
        self._timeout = timeout_s
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self.script = script
        self.sha = hashlib.sha1(script.encode()).hexdigest()

    async def run(self, keys: Sequence[str], args: Sequence[ScriptArg]) -> Any:
        try:
            async with asyncio.timeout(self._timeout), self._slots:
                try:
                    return await self.redis.evalsha(self.sha, len(keys), *keys, *args)
                except NoScriptError:  # an error reply: the connection is still in step
                    return await self.redis.eval(self.script, len(keys), *keys, *args)
        except TimeoutError:
            raise RedisTimeout(f"no reply from Redis within {self._timeout} s") from None

    async def drop_idle(self) -> None:
        """Close the idle connections (after an outage they are stale); usable again."""
        await self.redis.connection_pool.disconnect(inuse_connections=False)

    async def close(self) -> None:
        """Close every connection (a later call connects anew)."""
        await self.redis.connection_pool.disconnect()
