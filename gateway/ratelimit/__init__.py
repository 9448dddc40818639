"""Rate limits per tenant, API key and widget visitor: RPM, TPM and concurrency, shared through
Redis or in-process."""

from __future__ import annotations

from gateway.ratelimit.failover import FailoverLimiter
from gateway.ratelimit.memory import MemoryLimiter
from gateway.ratelimit.redis import RedisLimiter, make_client
from gateway.ratelimit.types import (
    SCOPE_KEY,
    SCOPE_TENANT,
    SCOPE_VISITOR,
    Decision,
    Lease,
    Limiter,
    LimiterUnavailable,
    Limits,
    Quota,
    Scope,
    ScopeState,
)

__all__ = [
    "SCOPE_KEY",
    "SCOPE_TENANT",
    "SCOPE_VISITOR",
    "Decision",
    "FailoverLimiter",
    "Lease",
    "Limiter",
    "LimiterUnavailable",
    "Limits",
    "MemoryLimiter",
    "Quota",
    "RedisLimiter",
    "Scope",
    "ScopeState",
    "make_client",
]
