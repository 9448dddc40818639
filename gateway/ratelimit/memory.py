"""In-process limiter: the same scopes, GCRA and lease rules as ``script.GCRA_LUA``, for one
process.

Used when no Redis is configured, and by the fail-over limiter as a mirror of what Redis last
reported (debts, this replica's leases) that takes over while Redis is unreachable. Then each
admission is made with this replica's ``share`` of every limit: a request costs ``1 / share``
of its global cost against the global debt, concurrency is capped at ``share`` of the limit, so
N replicas with share 1/N together admit what the shared limiter would have (see failover.py).
A lease of ``slots`` takes that many of a scope's concurrency; wider than the whole limit it is
never admissible (as in the script); wider than this replica's share only, it is admitted when
the scope holds nothing else here (a lone request that fits the limit is never refused forever).
Decisions are atomic because nothing here awaits between reading and writing state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

from gateway.ratelimit.leases import Held, LeaseBook, Renewer
from gateway.ratelimit.types import (
    PERIOD_MS,
    REASON_CONCURRENCY,
    REASON_REQUESTS,
    REASON_TOKENS,
    REASON_TOO_LARGE,
    REASON_TOO_WIDE,
    SLACK_MS,
    Decision,
    Lease,
    Quota,
    Scope,
    ScopeState,
)

ScopeKey = tuple[str, str, str]  # tenant, scope kind, scope id
HOLD_WEIGHT = 0.2  # weight of the newest hold time in the running mean
HOLD_KEEP_MS = 600_000.0  # a scope's mean hold time is forgotten after 10 min without leases
SWEEP_EVERY = 1024  # admissions between sweeps of state that ran out (visitors come and go)
Charge = tuple[float, float, float, float]  # new RPM TAT, new TPM TAT, current RPM, current TPM
LeaseTable = dict[str, tuple[float, int]]  # lease id -> (expiry ms, slots)


def _now_ms() -> float:
    return time.monotonic() * 1000.0


def scope_key(tenant: str, scope: Scope) -> ScopeKey:
    return (tenant, scope.kind, scope.id)


class MemoryLimiter:
    backend = "memory"

    def __init__(self, lease_ttl_s: float = 30.0, clock: Callable[[], float] = _now_ms) -> None:
        self._ttl_ms = lease_ttl_s * 1000.0
        self._clock = clock
        # (scope, "rpm"|"tpm") -> (TAT ms, the limit it was computed for)
        self._tat: dict[tuple[ScopeKey, str], tuple[float, int]] = {}
        self._leases: dict[ScopeKey, LeaseTable] = {}  # scope -> lease id -> (expiry ms, slots)
        self._hold: dict[ScopeKey, tuple[float, float]] = {}  # scope -> (mean hold ms, when)
        self._until_sweep = SWEEP_EVERY
        self.book = LeaseBook(clock=lambda: self._clock() / 1000.0)
        self._renewer = Renewer(self.book, self.renew, lease_ttl_s / 3)

    # -- GCRA state ---------------------------------------------------------------------------

    def _load(self, key: tuple[ScopeKey, str], limit: int, now: float) -> float:
        """TAT under ``limit``: a debt recorded under another limit keeps its request count."""
        hit = self._tat.get(key)
        if hit is None or hit[0] <= now:
            return now
        tat, old = hit
        return now + (tat - now) * old / limit if old != limit else tat

    def _store(self, key: tuple[ScopeKey, str], tat: float, limit: int, now: float) -> None:
        if tat <= now:
            self._tat.pop(key, None)
        else:
            self._tat[key] = (tat, limit)

    def debt_ms(self, key: ScopeKey, dim: str) -> float:
        hit = self._tat.get((key, dim))
        return max(0.0, hit[0] - self._clock()) if hit else 0.0

    def mirror(self, key: ScopeKey, dim: str, debt_ms: float, limit: int) -> None:
        """Take the debt the shared limiter just reported for this scope."""
        now = self._clock()
        self._store((key, dim), now + debt_ms, limit, now)

    # -- admission ----------------------------------------------------------------------------

    async def acquire(self, lease: Lease, share: float = 1.0) -> Decision:
        self._renewer.ensure_running()
        now = self._clock()
        self._until_sweep -= 1
        if self._until_sweep <= 0:
            self.sweep(now)
        keys = [scope_key(lease.tenant, s) for s in lease.scopes]
        tokens = lease.reserved_tokens
        charges = [
            self._charge(k, s, tokens, share, now) for k, s in zip(keys, lease.scopes, strict=True)
        ]
        reason, at, retry = _first_rejection(charges, lease, now)
        if reason is None:
            reason, at, retry = self._concurrency(keys, lease, share, now)
        if reason is None:
            self._take(keys, lease, charges, now)
            self.book.admitted(lease, 1.0 / share)
        states = tuple(
            _state(s, c[0:2] if reason is None else c[2:4], share, now)
            for s, c in zip(lease.scopes, charges, strict=True)
        )
        return Decision.of(lease, states, reason, at, retry)

    async def extend(self, lease: Lease, tokens: int, share: float = 1.0) -> Decision:
        now = self._clock()
        keys = [scope_key(lease.tenant, s) for s in lease.scopes]
        charges = [
            self._charge(k, s, tokens, share, now) for k, s in zip(keys, lease.scopes, strict=True)
        ]
        reason, at, retry = self._extension_refusal(keys[0], lease, tokens, charges, now)
        grown = lease.grown(tokens)
        if reason is None:
            for key, scope, charge in zip(keys, lease.scopes, charges, strict=True):
                if scope.limits.tpm:
                    self._store((key, "tpm"), charge[1], scope.limits.tpm, now)
            self.book.extended(grown)
        states = tuple(
            _state(s, (c[2], c[1] if reason is None else c[3]), share, now)
            for s, c in zip(lease.scopes, charges, strict=True)
        )
        return Decision.of(grown, states, reason, at, retry)

    def _extension_refusal(
        self, first: ScopeKey, lease: Lease, tokens: int, charges: list[Charge], now: float
    ) -> tuple[str | None, int | None, float]:
        """Why ``extend`` refuses: the lease no longer held, tokens beyond a whole TPM (never
        admissible), else the first TPM overrun; (None, None, 0) when it fits."""
        held = self._leases.get(first, {}).get(lease.lease_id)
        if held is None or held[0] <= now:
            return REASON_CONCURRENCY, 0, 0.0
        for i, scope in enumerate(lease.scopes):
            if scope.limits.tpm and tokens > scope.limits.tpm:
                return REASON_TOO_LARGE, i, -1.0
        for i, (scope, (_, tpm_new, _, _)) in enumerate(zip(lease.scopes, charges, strict=True)):
            if scope.limits.tpm and tpm_new - now > PERIOD_MS + SLACK_MS:
                return REASON_TOKENS, i, tpm_new - now - PERIOD_MS
        return None, None, 0.0

    async def charge(self, lease: Lease, share: float = 1.0) -> Decision:
        now = self._clock()
        keys = [scope_key(lease.tenant, s) for s in lease.scopes]
        charges = [
            self._charge(k, s, 0, share, now) for k, s in zip(keys, lease.scopes, strict=True)
        ]
        reason, at, retry = None, None, 0.0
        for i, (scope, (rpm_new, _, _, _)) in enumerate(zip(lease.scopes, charges, strict=True)):
            if scope.limits.rpm and rpm_new - now > PERIOD_MS + SLACK_MS:
                reason, at, retry = REASON_REQUESTS, i, rpm_new - now - PERIOD_MS
                break
        for key, scope, charge in zip(keys, lease.scopes, charges, strict=True):
            if reason is None and scope.limits.rpm:
                self._store((key, "rpm"), charge[0], scope.limits.rpm, now)
        states = tuple(
            ScopeState(
                s.kind, _quota(s.limits.rpm, c[0] if reason is None else c[2], share, now), None
            )
            for s, c in zip(lease.scopes, charges, strict=True)
        )
        return replace(Decision.of(lease, states, reason, at, retry), lease=None)

    def _take(self, keys: list[ScopeKey], lease: Lease, charges: list[Charge], now: float) -> None:
        for key, scope, charge in zip(keys, lease.scopes, charges, strict=True):
            if scope.limits.rpm:
                self._store((key, "rpm"), charge[0], scope.limits.rpm, now)
            if scope.limits.tpm:
                self._store((key, "tpm"), charge[1], scope.limits.tpm, now)
            self._leases.setdefault(key, {})[lease.lease_id] = (now + self._ttl_ms, lease.slots)

    def _charge(self, key: ScopeKey, scope: Scope, tokens: int, share: float, now: float) -> Charge:
        lim = scope.limits
        rpm_tat = self._load((key, "rpm"), lim.rpm, now) if lim.rpm else now
        tpm_tat = self._load((key, "tpm"), lim.tpm, now) if lim.tpm else now
        rpm_new = rpm_tat + PERIOD_MS / lim.rpm / share if lim.rpm else now
        tpm_new = tpm_tat + tokens * PERIOD_MS / lim.tpm / share if lim.tpm else now
        return rpm_new, tpm_new, rpm_tat, tpm_tat

    def _concurrency(
        self, keys: list[ScopeKey], lease: Lease, share: float, now: float
    ) -> tuple[str | None, int | None, float]:
        for i, (key, scope) in enumerate(zip(keys, lease.scopes, strict=True)):
            leases = self._leases.get(key)
            conc = scope.limits.share(share).max_concurrency
            if leases is None or not conc:
                continue
            for lease_id in [k for k, (exp, _) in leases.items() if exp <= now]:
                del leases[lease_id]
            if not leases:
                del self._leases[key]
            elif sum(slots for _, slots in leases.values()) + min(lease.slots, conc) > conc:
                retry = min(exp for exp, _ in leases.values()) - now
                return REASON_CONCURRENCY, i, min(retry, self._hold.get(key, (retry, 0))[0])
        return None, None, 0.0

    # -- leases -------------------------------------------------------------------------------

    async def release(self, lease: Lease, used_tokens: int) -> None:
        held, held_ms, weight = self.book.finish(lease)
        if held is Held.NONE:
            return
        now = self._clock()
        for scope in lease.scopes:
            key = scope_key(lease.tenant, scope)
            leases = self._leases.get(key, {})
            if leases.pop(lease.lease_id, None) is None:
                continue
            if not leases:
                self._leases.pop(key, None)
            if scope.limits.max_concurrency and held_ms > 0:
                mean = self._hold.get(key, (held_ms, now))[0]
                self._hold[key] = ((1 - HOLD_WEIGHT) * mean + HOLD_WEIGHT * held_ms, now)
            self._reconcile((key, "tpm"), (used_tokens - lease.reserved_tokens) * weight, now)

    def _reconcile(self, key: tuple[ScopeKey, str], delta_tokens: float, now: float) -> None:
        hit = self._tat.get(key)
        if hit is not None and hit[0] > now:
            tat, limit = hit
            self._store(key, max(tat + delta_tokens * PERIOD_MS / limit, now), limit, now)

    def sweep(self, now: float) -> None:
        """Forget what ran out: debts repaid, leases expired, old hold times (O(state))."""
        self._until_sweep = SWEEP_EVERY
        for key in [k for k, (tat, _) in self._tat.items() if tat <= now]:
            del self._tat[key]
        for scope in [k for k, (_, when) in self._hold.items() if now - when > HOLD_KEEP_MS]:
            del self._hold[scope]
        for scope, leases in list(self._leases.items()):
            for lease_id in [k for k, (exp, _) in leases.items() if exp <= now]:
                del leases[lease_id]
            if not leases:
                del self._leases[scope]

    def state_size(self) -> int:
        """Entries kept (debts, hold times, lease tables): bounded by recent traffic."""
        return len(self._tat) + len(self._hold) + len(self._leases)

    def adopt(self, lease: Lease) -> None:
        """Count a lease the shared limiter admitted until it is released here too."""
        now = self._clock()
        for scope in lease.scopes:
            key = scope_key(lease.tenant, scope)
            self._leases.setdefault(key, {})[lease.lease_id] = (now + self._ttl_ms, lease.slots)
        self.book.admitted(lease)

    async def renew(self, leases: list[Lease]) -> None:
        expiry = self._clock() + self._ttl_ms
        for lease in leases:
            for scope in lease.scopes:
                held = self._leases.get(scope_key(lease.tenant, scope))
                if held is not None and lease.lease_id in held:
                    held[lease.lease_id] = (expiry, lease.slots)

    def active_leases(self, tenant: str, kind: str = "tenant", scope_id: str | None = None) -> int:
        """Concurrency slots held in the scope (a lease of n slots counts n)."""
        now = self._clock()
        held = self._leases.get((tenant, kind, tenant if scope_id is None else scope_id), {})
        return sum(slots for exp, slots in held.values() if exp > now)

    def check_integrity(self) -> None:
        for (key, dim), (tat, limit) in self._tat.items():
            assert dim in ("rpm", "tpm"), f"unknown dimension {dim!r} for {key}"
            assert tat == tat and tat >= 0 and limit > 0, f"bad TAT {tat}/{limit} for {key}/{dim}"
        for key, leases in self._leases.items():
            assert leases, f"empty lease table kept for {key}"
            for lease_id, (expiry, slots) in leases.items():
                assert lease_id and expiry > 0 and slots >= 1, f"bad lease {lease_id!r} of {key}"
        self.book.check_integrity()

    async def warm(self) -> None:
        """Nothing to load: the state lives in this process."""

    def shared_state(self) -> None:
        return None

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        await self._renewer.close()


def _first_rejection(
    charges: list[Charge], lease: Lease, now: float
) -> tuple[str | None, int | None, float]:
    """Too large or too wide anywhere wins (never admissible); else the first RPM / TPM
    overrun."""
    first: tuple[str | None, int | None, float] = (None, None, 0.0)
    for i, (scope, (rpm_new, tpm_new, _, _)) in enumerate(zip(lease.scopes, charges, strict=True)):
        lim = scope.limits
        if lim.tpm and lease.reserved_tokens > lim.tpm:
            return REASON_TOO_LARGE, i, -1.0
        if lease.wider_than(scope):
            return REASON_TOO_WIDE, i, -1.0
        if first[0] is not None:
            continue
        if lim.rpm and rpm_new - now > PERIOD_MS + SLACK_MS:
            first = (REASON_REQUESTS, i, rpm_new - now - PERIOD_MS)
        elif lim.tpm and tpm_new - now > PERIOD_MS + SLACK_MS:
            first = (REASON_TOKENS, i, tpm_new - now - PERIOD_MS)
    return first


def _state(scope: Scope, tats: tuple[float, ...], share: float, now: float) -> ScopeState:
    lim = scope.limits
    return ScopeState(
        scope.kind, _quota(lim.rpm, tats[0], share, now), _quota(lim.tpm, tats[1], share, now)
    )


def _quota(limit: int, tat: float, share: float, now: float) -> Quota | None:
    """What this limiter will still admit (its share of the rest, while failed over)."""
    if not limit:
        return None
    remaining = math.floor((PERIOD_MS + SLACK_MS - (tat - now)) / (PERIOD_MS / limit) * share)
    return Quota(limit, remaining, math.ceil(tat - now))
