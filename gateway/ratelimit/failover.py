"""Redis limiter with a fallback: fail open to the in-process limiter, or fail closed.

State machine (one instance per app)::

    UP --(a Redis call fails, after one retry on a fresh connection)--> DOWN:
          admissions go to the in-process limiter (open) or raise LimiterUnavailable (closed)
    DOWN --(background heartbeat succeeds)--> UP: owed releases are sent first, then the next
          admission goes to Redis again

While UP, the in-process limiter mirrors what Redis reports (each scope's debt after every
decision, this replica's live leases), so when Redis goes away it continues from the shared
state instead of a fresh burst. While DOWN each replica admits its *share* of every limit:

    share = KVGATE_RATELIMIT_FAILOVER_SHARE when set, else 1 / (replicas seen in Redis)

where replicas are counted by heartbeats (every ``heartbeat_s``; alive = seen within three
beats) while Redis was up. N replicas with share 1/N together admit what Redis would have
(plus what each one's last view of the shared debt missed). When Redis comes back empty (a
restart), the first admissions of each scope within a minute carry this replica's debt as a hint
that seeds the lost state, so the limit does not restart with a full burst either.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import structlog
from redis.exceptions import RedisError

from gateway.ratelimit.leases import Held
from gateway.ratelimit.memory import MemoryLimiter, scope_key
from gateway.ratelimit.redis import RedisLimiter
from gateway.ratelimit.types import (
    PERIOD_MS,
    Decision,
    Lease,
    LimiterUnavailable,
    SharedState,
)

log = structlog.get_logger(__name__)

REDIS_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
MAX_OWED = 10_000  # releases kept for Redis while it is away (beyond that, the TTL frees them)


class FailoverLimiter:
    def __init__(
        self,
        primary: RedisLimiter,
        fallback: MemoryLimiter,
        *,
        fail_open: bool = True,
        retry_s: float = 1.0,
        share: float | None = None,
        heartbeat_s: float = 5.0,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.fail_open = fail_open
        self.retry_s = retry_s
        self.configured_share = share
        self.heartbeat_s = heartbeat_s
        self.replicas = 1  # live replicas last seen in Redis
        self.down = False
        self.failovers = 0  # UP -> DOWN transitions
        self.fallback_decisions = 0  # admissions decided in-process while DOWN
        self._owed: dict[str, tuple[Lease, int, float, bool]] = {}  # Redis releases to send
        self._recovered_at: float | None = None
        self._probe: asyncio.Task[None] | None = None
        self._beat: asyncio.Task[None] | None = None
        primary.hints = self._hints

    @property
    def share(self) -> float:
        return self.configured_share or 1.0 / max(1, self.replicas)

    # -- admission ----------------------------------------------------------------------------

    async def acquire(self, lease: Lease) -> Decision:
        self._ensure_heartbeat()
        if not self.down:
            try:
                decision = await self.primary.acquire(lease)
            except REDIS_ERRORS as exc:
                await self._mark_down(exc)
            else:
                self._mirror(lease, decision)
                return decision
        if not self.fail_open:
            raise LimiterUnavailable("rate limiter unavailable")
        self.fallback_decisions += 1
        return await self.fallback.acquire(lease, self.share)

    async def extend(self, lease: Lease, tokens: int) -> Decision:
        if not self.down:
            try:
                decision = await self.primary.extend(lease, tokens)
            except REDIS_ERRORS as exc:
                await self._mark_down(exc)
            else:
                self._mirror_debts(lease, decision)
                if decision.lease is not None:
                    self.fallback.book.extended(decision.lease)
                return decision
        if not self.fail_open:
            raise LimiterUnavailable("rate limiter unavailable")
        self.fallback_decisions += 1
        return await self.fallback.extend(lease, tokens, self.share)

    async def charge(self, lease: Lease) -> Decision:
        if not self.down:
            try:
                decision = await self.primary.charge(lease)
            except REDIS_ERRORS as exc:
                await self._mark_down(exc)
            else:
                self._mirror_debts(lease, decision)
                return decision
        if not self.fail_open:
            raise LimiterUnavailable("rate limiter unavailable")
        return await self.fallback.charge(lease, self.share)

    def _mirror(self, lease: Lease, decision: Decision) -> None:
        self._mirror_debts(lease, decision)
        if decision.allowed:
            self.fallback.adopt(lease)

    def _mirror_debts(self, lease: Lease, decision: Decision) -> None:
        for scope, state in zip(lease.scopes, decision.states, strict=True):
            key = scope_key(lease.tenant, scope)
            if state.requests is not None:
                self.fallback.mirror(key, "rpm", state.requests.reset_ms, scope.limits.rpm)
            if state.tokens is not None:
                self.fallback.mirror(key, "tpm", state.tokens.reset_ms, scope.limits.tpm)

    def _hints(self, lease: Lease) -> Sequence[tuple[float, float]] | None:
        """Within a minute of a recovery: this replica's debts, to seed what Redis lost."""
        if self._recovered_at is None or time.monotonic() - self._recovered_at > PERIOD_MS / 1e3:
            return None
        keys = [scope_key(lease.tenant, s) for s in lease.scopes]
        return [(self.fallback.debt_ms(k, "rpm"), self.fallback.debt_ms(k, "tpm")) for k in keys]

    async def release(self, lease: Lease, used_tokens: int) -> None:
        await self.fallback.release(lease, used_tokens)
        held, held_ms, _ = self.primary.book.finish(lease)
        if held is Held.NONE:
            return
        doubt = held is Held.DOUBT
        if self.down:
            self._owe(lease, used_tokens, held_ms, doubt)
            return
        try:
            await self.primary.release_in_redis(lease, used_tokens, held_ms, doubt=doubt)
        except REDIS_ERRORS as exc:
            self._owe(lease, used_tokens, held_ms, doubt)
            await self._mark_down(exc)

    def _owe(self, lease: Lease, used_tokens: int, held_ms: float, doubt: bool) -> None:
        if len(self._owed) < MAX_OWED:
            self._owed[lease.lease_id] = (lease, used_tokens, held_ms, doubt)

    async def _settle_owed(self) -> None:
        while self._owed:
            lease_id, (lease, used, held_ms, doubt) = next(iter(self._owed.items()))
            await self.primary.release_in_redis(lease, used, held_ms, doubt=doubt)
            del self._owed[lease_id]

    # -- up / down ----------------------------------------------------------------------------

    async def _mark_down(self, exc: BaseException) -> None:
        if not self.down:
            self.down = True
            self.failovers += 1
            mode = "open" if self.fail_open else "closed"
            log.warning(
                "ratelimit_redis_down", error=type(exc).__name__, fail_mode=mode, share=self.share
            )
            await self.primary.drop_connections()
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        while self.down:
            await asyncio.sleep(self.retry_s)
            with contextlib.suppress(*REDIS_ERRORS):
                await self.beat()
                await self._settle_owed()
                self._recovered_at = time.monotonic()
                self.down = False
                log.info("ratelimit_redis_recovered", replicas=self.replicas)

    async def beat(self) -> None:
        """Announce this replica and count the live ones (the fail-over share)."""
        window = int(self.heartbeat_s * 3 * 1000)
        self.replicas = max(1, await self.primary.heartbeat(window))

    def _ensure_heartbeat(self) -> None:
        if self._beat is None or self._beat.done():
            self._beat = asyncio.get_running_loop().create_task(self._beat_loop())

    async def _beat_loop(self) -> None:
        while True:
            if not self.down:
                with contextlib.suppress(*REDIS_ERRORS):  # outages are the admissions' to find
                    await self.beat()
            await asyncio.sleep(self.heartbeat_s)

    async def warm(self) -> None:
        """Load the script and announce this replica. Unreachable: fail open starts degraded;
        fail closed raises ``LimiterUnavailable``."""
        self._ensure_heartbeat()
        try:
            await self.primary.warm()
            await self.beat()
        except REDIS_ERRORS as exc:
            await self._mark_down(exc)
            if not self.fail_open:
                raise LimiterUnavailable(f"Redis unreachable ({type(exc).__name__})") from None

    def shared_state(self) -> SharedState:
        return SharedState(self.down, self.fail_open, self.failovers, self.fallback_decisions)

    async def ping(self) -> bool:
        try:
            return await self.primary.ping()
        except REDIS_ERRORS:
            return False

    def check_integrity(self) -> None:
        self.fallback.check_integrity()
        self.primary.book.check_integrity()
        assert 0 < self.share <= 1, f"share {self.share} outside (0, 1]"

    async def close(self) -> None:
        self.down = False
        for task in (self._probe, self._beat):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.primary.close()
        await self.fallback.close()
