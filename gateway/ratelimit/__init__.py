"""Per-tenant rate limits: RPM, TPM and concurrency, shared through Redis or in-process."""

from __future__ import annotations

from gateway.ratelimit.failover import FailoverLimiter
from gateway.ratelimit.memory import MemoryLimiter
from gateway.ratelimit.redis import RedisLimiter, make_client
from gateway.ratelimit.types import Decision, Lease, Limiter, LimiterUnavailable, Limits, Quota

__all__ = [
    "Decision",
    "FailoverLimiter",
    "Lease",
    "Limiter",
    "LimiterUnavailable",
    "Limits",
    "MemoryLimiter",
    "Quota",
    "RedisLimiter",
    "make_client",
]
