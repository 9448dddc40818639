"""Rate-limit vocabulary shared by the Redis, in-process and fail-over limiters.

Each tenant has three limits, all checked and taken together in one atomic step:

    requests per minute (RPM)   GCRA, burst = the whole minute's allowance
    tokens per minute (TPM)     GCRA on tokens; admission reserves prompt + max output tokens,
                                release reconciles with the real usage (refund or extra charge)
    concurrency                 leases with a TTL (a crashed replica's leases expire by themselves)

A limit of 0 means unlimited; its dimension is skipped and reports no headers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

PERIOD_MS = 60_000.0  # both RPM and TPM refill over one minute

# Reasons for a rejection, in the order the limiter checks them.
REASON_REQUESTS = "requests"
REASON_TOKENS = "tokens"
REASON_CONCURRENCY = "concurrency"
REASON_TOO_LARGE = "too_large"  # tokens of one request exceed the whole TPM: never admissible
REASONS = (None, REASON_REQUESTS, REASON_TOKENS, REASON_CONCURRENCY, REASON_TOO_LARGE)


class LimiterUnavailable(Exception):
    """The shared limiter is unreachable and the gateway is configured to fail closed."""


@dataclass(frozen=True)
class Limits:
    rpm: int = 0
    tpm: int = 0
    max_concurrency: int = 0

    def __post_init__(self) -> None:
        if min(self.rpm, self.tpm, self.max_concurrency) < 0:
            raise ValueError(f"limits must be >= 0 (0 = unlimited): {self}")


@dataclass(frozen=True)
class Quota:
    """One dimension after a decision: what the x-ratelimit-* headers report."""

    limit: int
    remaining: int
    reset_ms: float  # time until this dimension is fully replenished


@dataclass(frozen=True)
class Lease:
    """Proof of admission; ``release`` must be called exactly once (in ``finally``)."""

    tenant: str
    lease_id: str
    limits: Limits
    reserved_tokens: int
    backend: str  # "redis" or "memory": release goes where the lease was taken


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str | None
    requests: Quota | None  # None when RPM is unlimited
    tokens: Quota | None  # None when TPM is unlimited
    retry_after_ms: float  # 0 when allowed; -1 when never admissible
    lease: Lease | None  # set exactly when allowed

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for suffix, quota in (("requests", self.requests), ("tokens", self.tokens)):
            if quota is None:
                continue
            out[f"x-ratelimit-limit-{suffix}"] = str(quota.limit)
            out[f"x-ratelimit-remaining-{suffix}"] = str(max(0, quota.remaining))
            out[f"x-ratelimit-reset-{suffix}"] = format_duration(quota.reset_ms)
        if not self.allowed and self.retry_after_ms >= 0:
            out["Retry-After"] = str(max(1, math.ceil(self.retry_after_ms / 1000.0)))
        return out


def format_duration(ms: float) -> str:
    """OpenAI style durations: ``0s``, ``20ms``, ``1.5s``, ``6m0s``."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{math.ceil(ms)}ms"
    seconds = ms / 1000.0
    minutes, rest = divmod(seconds, 60.0)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


class Limiter(Protocol):
    async def acquire(self, tenant: str, limits: Limits, tokens: int) -> Decision: ...

    async def release(self, lease: Lease, used_tokens: int) -> None: ...

    async def close(self) -> None: ...
