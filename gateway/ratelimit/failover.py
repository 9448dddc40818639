"""Redis limiter with a fallback: fail open to the in-process limiter, or fail closed.

State machine (one instance per app)::

    UP --(Redis error on a call)--> DOWN: decisions go to the fallback (open) or raise
    DOWN --(background PING succeeds)--> UP: the next decision goes to Redis again

Requests never wait for a dead Redis twice: after the first failure a probe task pings it every
``retry_s`` while traffic uses the fallback. Leases are released where they were taken.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from redis.exceptions import RedisError

from gateway.ratelimit.memory import MemoryLimiter
from gateway.ratelimit.redis import RedisLimiter
from gateway.ratelimit.types import Decision, Lease, LimiterUnavailable, Limits

log = structlog.get_logger(__name__)

REDIS_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


class FailoverLimiter:
    def __init__(
        self,
        primary: RedisLimiter,
        fallback: MemoryLimiter,
        *,
        fail_open: bool = True,
        retry_s: float = 1.0,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.fail_open = fail_open
        self.retry_s = retry_s
        self.down = False
        self.failovers = 0  # UP -> DOWN transitions
        self.fallback_decisions = 0  # admissions decided in-process while DOWN
        self._probe: asyncio.Task[None] | None = None

    def _mark_down(self, exc: BaseException) -> None:
        if not self.down:
            self.down = True
            self.failovers += 1
            mode = "open" if self.fail_open else "closed"
            log.warning("ratelimit_redis_down", error=type(exc).__name__, fail_mode=mode)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        while self.down:
            await asyncio.sleep(self.retry_s)
            with contextlib.suppress(*REDIS_ERRORS):
                await self.primary.ping()
                self.down = False
                log.info("ratelimit_redis_recovered")

    async def acquire(self, tenant: str, limits: Limits, tokens: int) -> Decision:
        if not self.down:
            try:
                return await self.primary.acquire(tenant, limits, tokens)
            except REDIS_ERRORS as exc:
                self._mark_down(exc)
        if not self.fail_open:
            raise LimiterUnavailable("rate limiter unavailable")
        self.fallback_decisions += 1
        return await self.fallback.acquire(tenant, limits, tokens)

    async def release(self, lease: Lease, used_tokens: int) -> None:
        if lease.backend == self.fallback.backend:
            await self.fallback.release(lease, used_tokens)
            return
        try:
            await self.primary.release(lease, used_tokens)
        except REDIS_ERRORS as exc:
            # The lease expires by its TTL; the TPM reservation stands. Both err on the safe side.
            log.warning("ratelimit_release_failed", error=type(exc).__name__)
            self._mark_down(exc)

    async def warm(self) -> None:
        try:
            await self.primary.warm()
        except REDIS_ERRORS as exc:
            self._mark_down(exc)

    async def ping(self) -> bool:
        try:
            return await self.primary.ping()
        except REDIS_ERRORS:
            return False

    async def close(self) -> None:
        self.down = False
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await self.primary.close()
