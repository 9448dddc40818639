"""Shared limiter: one EVALSHA of ``script.GCRA_LUA`` per admission and one per release.

Exact across replicas because the whole decision (read TATs, check, write) runs inside Redis as
one script with the server's clock. The script is sent by SHA; after a Redis restart or SCRIPT
FLUSH the NOSCRIPT error falls back to EVAL with the source, which also caches it again. The
script calls go through ``calls.ScriptCalls`` (pooled connections, no command layer); ``client``
serves everything else (script load, ping, inspection).
"""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.ratelimit.calls import ScriptCalls
from gateway.ratelimit.script import GCRA_LUA
from gateway.ratelimit.types import REASONS, Decision, Lease, Limits, Quota


def make_client(url: str, timeout_s: float) -> aioredis.Redis:
    """A client that fails fast: no retries, short timeouts (the fallback takes over instead)."""
    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
    )


class RedisLimiter:
    backend = "redis"

    def __init__(self, client: aioredis.Redis, prefix: str, lease_ttl_s: float = 600.0) -> None:
        self.client = client
        self.prefix = prefix
        self._ttl_ms = int(lease_ttl_s * 1000)
        self._calls = ScriptCalls(client, GCRA_LUA)

    def keys(self, tenant: str) -> list[str]:
        # The hash tag keeps one tenant's keys in one cluster slot (a script needs that).
        base = f"{self.prefix}rl:{{{tenant}}}"
        return [f"{base}:rpm", f"{base}:tpm", f"{base}:leases"]

    async def acquire(self, tenant: str, limits: Limits, tokens: int) -> Decision:
        lease_id = uuid.uuid4().hex
        args: list[object] = ["acquire", limits.rpm, limits.tpm, limits.max_concurrency]
        args += [tokens, lease_id, self._ttl_ms]
        reply = await self._calls.run(self.keys(tenant), args)  # seven integers in one string
        allowed, reason, rpm_rem, rpm_reset, tpm_rem, tpm_reset, retry = map(int, reply.split())
        return Decision(
            allowed=bool(allowed),
            reason=REASONS[reason],
            requests=Quota(limits.rpm, rpm_rem, rpm_reset) if limits.rpm else None,
            tokens=Quota(limits.tpm, tpm_rem, tpm_reset) if limits.tpm else None,
            retry_after_ms=float(retry),
            lease=Lease(tenant, lease_id, limits, tokens, self.backend) if allowed else None,
        )

    async def release(self, lease: Lease, used_tokens: int) -> None:
        lim = lease.limits
        args: list[object] = ["release", lim.rpm, lim.tpm, lim.max_concurrency]
        args += [lease.reserved_tokens, lease.lease_id, used_tokens]
        await self._calls.run(self.keys(lease.tenant), args)

    async def active_leases(self, tenant: str) -> int:
        return int(await self.client.zcard(self.keys(tenant)[2]))

    async def warm(self) -> None:
        """Connect and load the script, so the first admission is one EVALSHA like the rest."""
        await self.client.script_load(self._calls.script)

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        await self._calls.close()
        await self.client.aclose()
