"""In-process limiter: the same GCRA + lease rules as ``script.GCRA_LUA``, for one process.

Used when no Redis is configured, and as the fail-open fallback while Redis is unreachable.
Decisions are atomic because nothing here awaits between reading and writing state.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable

from gateway.ratelimit.types import (
    PERIOD_MS,
    REASON_CONCURRENCY,
    REASON_REQUESTS,
    REASON_TOKENS,
    REASON_TOO_LARGE,
    Decision,
    Lease,
    Limits,
    Quota,
)


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class MemoryLimiter:
    backend = "memory"

    def __init__(self, lease_ttl_s: float = 600.0, clock: Callable[[], float] = _now_ms) -> None:
        self._ttl_ms = lease_ttl_s * 1000.0
        self._clock = clock
        self._tat: dict[tuple[str, str], float] = {}  # (tenant, "rpm"|"tpm") -> TAT ms
        self._leases: dict[str, dict[str, float]] = {}  # tenant -> lease id -> expiry ms

    def _load(self, key: tuple[str, str], now: float) -> float:
        return max(self._tat.get(key, now), now)

    def _store(self, key: tuple[str, str], tat: float, now: float) -> None:
        if tat <= now:
            self._tat.pop(key, None)
        else:
            self._tat[key] = tat

    async def acquire(self, tenant: str, limits: Limits, tokens: int) -> Decision:
        now = self._clock()
        reason: str | None = None
        retry = 0.0
        rpm_tat = rpm_new = tpm_tat = tpm_new = now
        if limits.rpm:
            rpm_tat = self._load((tenant, "rpm"), now)
            rpm_new = rpm_tat + PERIOD_MS / limits.rpm
            if rpm_new - now > PERIOD_MS:
                reason, retry = REASON_REQUESTS, rpm_new - now - PERIOD_MS
        if limits.tpm:
            tpm_tat = self._load((tenant, "tpm"), now)
            tpm_new = tpm_tat + tokens * PERIOD_MS / limits.tpm
            if tokens > limits.tpm:
                reason, retry = REASON_TOO_LARGE, -1.0
            elif reason is None and tpm_new - now > PERIOD_MS:
                reason, retry = REASON_TOKENS, tpm_new - now - PERIOD_MS
        leases = self._leases.setdefault(tenant, {})
        if reason is None and limits.max_concurrency:
            for lease_id in [k for k, exp in leases.items() if exp <= now]:
                del leases[lease_id]
            if len(leases) >= limits.max_concurrency:
                reason, retry = REASON_CONCURRENCY, min(min(leases.values()) - now, 1000.0)
        lease = None
        if reason is None:
            self._store((tenant, "rpm"), rpm_new, now)
            self._store((tenant, "tpm"), tpm_new, now)
            lease = Lease(tenant, uuid.uuid4().hex, limits, tokens, self.backend)
            if limits.max_concurrency:
                leases[lease.lease_id] = now + self._ttl_ms
        else:
            rpm_new, tpm_new = rpm_tat, tpm_tat
        return Decision(
            allowed=reason is None,
            reason=reason,
            requests=_quota(limits.rpm, rpm_new, now),
            tokens=_quota(limits.tpm, tpm_new, now),
            retry_after_ms=retry,
            lease=lease,
        )

    async def release(self, lease: Lease, used_tokens: int) -> None:
        self._leases.get(lease.tenant, {}).pop(lease.lease_id, None)
        tpm = lease.limits.tpm
        key = (lease.tenant, "tpm")
        if tpm and key in self._tat:
            now = self._clock()
            delta = (used_tokens - lease.reserved_tokens) * PERIOD_MS / tpm
            self._store(key, max(self._tat[key] + delta, now), now)

    def active_leases(self, tenant: str) -> int:
        now = self._clock()
        return sum(1 for exp in self._leases.get(tenant, {}).values() if exp > now)

    def check_integrity(self) -> None:
        for (tenant, dim), tat in self._tat.items():
            assert dim in ("rpm", "tpm"), f"unknown dimension {dim!r} for {tenant}"
            assert tat == tat and tat >= 0, f"bad TAT {tat} for {tenant}/{dim}"
        for tenant, leases in self._leases.items():
            for lease_id, expiry in leases.items():
                assert lease_id and expiry > 0, f"bad lease {lease_id!r} of {tenant}"

    async def close(self) -> None:
        return None


def _quota(limit: int, tat: float, now: float) -> Quota | None:
    if not limit:
        return None
    remaining = math.floor((PERIOD_MS - (tat - now)) / (PERIOD_MS / limit))
    return Quota(limit, remaining, math.ceil(tat - now))
