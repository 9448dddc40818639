"""Shared limiter: one EVALSHA of ``script.GCRA_LUA`` per admission and one per release.

Exact across replicas because the whole decision (read TATs of every scope, check, write) runs
inside Redis as one script with the server's clock. The script is sent by SHA; after a Redis
restart or SCRIPT FLUSH the NOSCRIPT error falls back to EVAL with the source, which also caches
it again. The script calls go through ``calls.ScriptCalls`` (redis-py's command API on a client
of their own: one deadline per call, bounded connections, one retry of a stale connection);
``client`` serves everything else (script load, ping, inspection).

Keys, all under the tenant's hash tag (one cluster slot, so one script may touch them all)::

    {prefix}rl:{tenant}:rpm | :tpm | :leases | :hold          the tenant scope (:leases: one
                                                              member per slot of each lease)
    {prefix}rl:{tenant}:key:<key id>:rpm | ...                a key with limits of its own
    {prefix}rl:{tenant}:visitor:<visitor hash>:rpm | ...      a widget visitor
    {prefix}rl:{tenant}:gone:<lease id>                       tombstone of a lease in doubt
    {prefix}rl:replicas                                       live replicas (heartbeats)
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import replace

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.ratelimit.calls import ScriptArg, ScriptCalls, make_script_client
from gateway.ratelimit.leases import Held, LeaseBook, Renewer
from gateway.ratelimit.script import GCRA_LUA
from gateway.ratelimit.types import (
    REASONS,
    SCOPE_TENANT,
    Decision,
    Lease,
    Limits,
    Quota,
    Scope,
    ScopeState,
)

# per scope: (rpm debt, tpm debt) ms this replica knows of, or None (no hints)
Hints = Callable[[Lease], Sequence[tuple[float, float]] | None]


def make_client(url: str, timeout_s: float) -> aioredis.Redis:
    """A client that fails fast: short timeouts, and no retry but one of a connection error (a
    pooled connection that Redis closed since its last use, as a restart does: reconnected and
    sent again at once); otherwise the fallback takes over."""
    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1, (RedisConnectionError,)),
        retry_on_timeout=False,
    )


class RedisLimiter:
    backend = "redis"

    @classmethod
    def connect(
        cls, url: str, timeout_s: float, prefix: str, lease_ttl_s: float = 30.0
    ) -> RedisLimiter:
        """The limiter ``kvgate serve`` runs: both clients on ``url``, failing within
        ``timeout_s``."""
        scripts = make_script_client(url, timeout_s)
        return cls(make_client(url, timeout_s), prefix, lease_ttl_s, scripts=scripts)

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        lease_ttl_s: float = 30.0,
        *,
        scripts: aioredis.Redis | None = None,
    ) -> None:
        """``client`` (``make_client``) for the rare calls; ``scripts`` (``make_script_client``)
        for the two script calls per request, each under one deadline of ``client``'s socket
        timeout. Without ``scripts`` they share ``client`` (correct, with its socket timeouts
        on top: ~70 us more per call)."""
        self.client = client
        self.prefix = prefix
        self._ttl_ms = int(lease_ttl_s * 1000)
        timeout = client.get_connection_kwargs().get("socket_timeout")
        self._calls = ScriptCalls(scripts or client, GCRA_LUA, timeout)
        self.book = LeaseBook()
        self.renewer = Renewer(self.book, self.renew, lease_ttl_s / 3)
        self.replica_id = secrets.token_hex(8)
        self.hints: Hints | None = None  # the fail-over limiter's debts, used after an outage

    def scope_base(self, tenant: str, scope: Scope) -> str:
        # The hash tag keeps one tenant's keys in one cluster slot (a script needs that).
        base = f"{self.prefix}rl:{{{tenant}}}"
        return base if scope.kind == SCOPE_TENANT else f"{base}:{scope.kind}:{scope.id}"

    def keys(self, lease: Lease) -> list[str]:
        out = [f"{self.prefix}rl:{{{lease.tenant}}}:gone:{lease.lease_id}"]
        for scope in lease.scopes:
            base = self.scope_base(lease.tenant, scope)
            out += [f"{base}:rpm", f"{base}:tpm", f"{base}:leases", f"{base}:hold"]
        return out

    async def acquire(self, lease: Lease) -> Decision:
        self.renewer.ensure_running()
        hints = self.hints(lease) if self.hints is not None else None
        args: list[ScriptArg] = ["acquire", lease.lease_id, self._ttl_ms, lease.reserved_tokens]
        args += [lease.slots, len(lease.scopes)]
        for i, scope in enumerate(lease.scopes):
            lim = scope.limits
            rpm_hint, tpm_hint = hints[i] if hints else (0, 0)
            args += [lim.rpm, lim.tpm, lim.max_concurrency, int(rpm_hint), int(tpm_hint)]
        self.book.begin(lease)
        reply = await self._calls.run(self.keys(lease), args)
        decision = _decision(lease, [int(x) for x in reply.split()])
        (self.book.admitted if decision.allowed else self.book.rejected)(lease)
        return decision

    async def extend(self, lease: Lease, tokens: int) -> Decision:
        args: list[ScriptArg] = ["extend", lease.lease_id, tokens, len(lease.scopes)]
        for scope in lease.scopes:
            args += [scope.limits.rpm, scope.limits.tpm]
        reply = await self._calls.run(self.keys(lease), args)
        decision = _decision(lease.grown(tokens), [int(x) for x in reply.split()])
        if decision.lease is not None:
            self.book.extended(decision.lease)
        return decision

    async def charge(self, lease: Lease) -> Decision:
        keys = [f"{self.scope_base(lease.tenant, s)}:rpm" for s in lease.scopes]
        args: list[ScriptArg] = ["charge", *(s.limits.rpm for s in lease.scopes)]
        reply = await self._calls.run(keys, args)
        return _charge_decision(lease, [int(x) for x in reply.split()])

    async def release(self, lease: Lease, used_tokens: int) -> None:
        held, held_ms, _ = self.book.finish(lease)
        if held is Held.NONE:
            return
        await self.release_in_redis(lease, used_tokens, held_ms, doubt=held is Held.DOUBT)

    async def release_in_redis(
        self, lease: Lease, used_tokens: int, held_ms: float, *, doubt: bool
    ) -> None:
        args: list[ScriptArg] = ["release", lease.lease_id, used_tokens, lease.reserved_tokens]
        args += [int(held_ms), int(doubt), self._ttl_ms, lease.slots, len(lease.scopes)]
        for scope in lease.scopes:
            args += [scope.limits.rpm, scope.limits.tpm, scope.limits.max_concurrency]
        await self._calls.run(self.keys(lease), args)

    async def renew(self, leases: list[Lease]) -> None:
        """Extend every live lease's TTL: one script call per tenant (one hash tag per call)."""
        by_tenant: dict[str, list[Lease]] = {}
        for lease in leases:
            by_tenant.setdefault(lease.tenant, []).append(lease)
        for tenant, group in by_tenant.items():
            index: dict[str, int] = {}
            args: list[ScriptArg] = ["renew", self._ttl_ms]
            for lease in group:
                for scope in lease.scopes:
                    key = f"{self.scope_base(tenant, scope)}:leases"
                    args += [index.setdefault(key, len(index) + 1), lease.lease_id, lease.slots]
            await self._calls.run(list(index), args)

    async def heartbeat(self, window_ms: int) -> int:
        """Say this replica is alive; the number of replicas seen within ``window_ms``."""
        key = f"{self.prefix}rl:replicas"
        return int(await self._calls.run([key], ["beat", self.replica_id, window_ms]))

    async def active_leases(self, tenant: str, scope: Scope | None = None) -> int:
        """Concurrency slots held in the scope (a lease of n slots counts n)."""
        base = self.scope_base(tenant, scope or Scope(SCOPE_TENANT, tenant, Limits()))
        return int(await self.client.zcard(f"{base}:leases"))

    async def drop_connections(self) -> None:
        """Close idle script connections (after an outage they are stale)."""
        await self._calls.drop_idle()

    async def warm(self) -> None:
        """Connect and load the script, so the first admission is one EVALSHA like the rest."""
        await self.client.script_load(self._calls.script)

    def shared_state(self) -> None:
        """Alone (no in-process fall-back) there is nothing to fail over: see FailoverLimiter."""
        return None

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        await self.renewer.close()
        await self._calls.close()
        if self._calls.redis is not self.client:
            await self._calls.redis.aclose()
        await self.client.aclose()


def _decision(lease: Lease, values: list[int]) -> Decision:
    allowed, reason, at, retry = values[:4]
    states = []
    for i, scope in enumerate(lease.scopes):
        rpm_rem, rpm_reset, tpm_rem, tpm_reset = values[4 + 4 * i : 8 + 4 * i]
        lim = scope.limits
        states.append(
            ScopeState(
                scope.kind,
                Quota(lim.rpm, rpm_rem, rpm_reset) if lim.rpm else None,
                Quota(lim.tpm, tpm_rem, tpm_reset) if lim.tpm else None,
            )
        )
    rejecting = at - 1 if not allowed else None
    return Decision.of(lease, tuple(states), REASONS[reason], rejecting, float(retry))


def _charge_decision(lease: Lease, values: list[int]) -> Decision:
    allowed, reason, at, retry = values[:4]
    states = []
    for i, scope in enumerate(lease.scopes):
        remaining, reset = values[4 + 2 * i : 6 + 2 * i]
        rpm = scope.limits.rpm
        states.append(ScopeState(scope.kind, Quota(rpm, remaining, reset) if rpm else None, None))
    rejecting = at - 1 if not allowed else None
    decision = Decision.of(lease, tuple(states), REASONS[reason], rejecting, float(retry))
    return replace(decision, lease=None)
