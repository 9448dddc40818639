"""Admin throttles: writes per principal, failed sign-ins per client address.

    writes      every admin write (a route declared ``write`` in access.py) takes one request of
                its principal's ``writes_per_minute`` (GCRA; the whole minute is the burst);
                beyond it: 429 ``rate_limit_exceeded`` with ``Retry-After``, nothing written
    sign-ins    every failed sign-in (a wrong bearer token, a wrong token at the console's
                sign-in) takes one of its client address's ``failures_per_minute``; the failure
                that finds none left blocks the address: until the debt is paid, every bearer
                token and console sign-in from it is a 429 before its token is looked at (a
                valid one too: a guess must not be told apart from a wrong one)

Both counts are the gateway's rate limiter (gateway/ratelimit/: its ``charge``, one request from
a scope's RPM or none), so with Redis they are shared by every replica and survive a restart;
without Redis, or while it is away and the limiter fails open, they are this replica's. The
block itself is remembered by the replica that saw the refused charge (a refused charge is
still a failure, so another replica learns the block at the address's next failure there: at
most one guess per replica past the shared budget). An address is the TCP peer, or behind
``KVGATE_TRUSTED_PROXIES`` the forwarded client (gateway/ratelimit/scopes.py), kept hashed.

A limiter that fails closed and cannot reach Redis does not stop admin writes or sign-ins: the
throttles are a safety valve for a runaway script or a guessing client, and the admin API must
stay usable during a Redis outage (the console's sessions have their own rule).
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from aiohttp import web

from gateway.errors import ApiError
from gateway.ratelimit import (
    Decision,
    Lease,
    Limiter,
    LimiterUnavailable,
    Limits,
    MemoryLimiter,
    Scope,
)
from gateway.ratelimit.scopes import (
    DEFAULT_IPV6_PREFIX,
    IPNetwork,
    client_address,
    visitor_address,
)

log = structlog.get_logger(__name__)

TAG = "admin"  # the limiter's hash tag of these scopes (no tenant scope has their kinds)
WRITES = "admin_writes"
FAILURES = "admin_sign_in_failures"
MAX_BLOCKED = 10_000  # addresses remembered as blocked; the oldest is forgotten beyond


@dataclass(frozen=True)
class ThrottleLimits:
    writes_per_minute: int = 60
    failures_per_minute: int = 10
    trusted_proxies: Sequence[IPNetwork] = ()
    ipv6_prefix: int = DEFAULT_IPV6_PREFIX  # an IPv6 client's network is one address here


class AdminThrottle:
    def __init__(
        self,
        limits: ThrottleLimits = ThrottleLimits(),
        limiter: Callable[[], Limiter | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``limiter()``: the gateway's limiter once it runs (None: this throttle's own, in
        process: the admin app alone, or before start-up)."""
        self.limits = limits
        self._shared = limiter
        self._own = MemoryLimiter()
        self._clock = clock
        self._blocked: OrderedDict[str, float] = OrderedDict()  # address digest -> until

    def address(self, request: web.Request) -> str:
        """The client as the visitor rules count it (gateway/access/visitor.py: every
        X-Forwarded-For header of a trusted proxy, an IPv6 network as one address), hashed."""
        forwarded = ",".join(request.headers.getall("X-Forwarded-For", ())) or None
        who = client_address(request.remote, forwarded, self.limits.trusted_proxies)
        who = visitor_address(who, self.limits.ipv6_prefix)
        return hashlib.blake2b(who.encode(), digest_size=8).hexdigest()

    async def write(self, principal_id: str) -> None:
        """One write of ``principal_id``, or a 429 (nothing taken)."""
        decision = await self._charge(WRITES, principal_id, self.limits.writes_per_minute)
        if decision is not None and not decision.allowed:
            raise _refused(
                f"too many admin writes by this principal (at most "
                f"{self.limits.writes_per_minute} a minute); retry later",
                decision,
            )

    def check_sign_in(self, address: str) -> None:
        """A 429 while ``address`` is blocked (before its token is looked at)."""
        until = self._blocked.get(address)
        if until is None:
            return
        left = until - self._clock()
        if left <= 0:
            del self._blocked[address]
            return
        raise _blocked(left)

    async def failed_sign_in(self, address: str) -> None:
        """Count a failed sign-in; the one that finds no room blocks the address (429)."""
        per_minute = self.limits.failures_per_minute
        decision = await self._charge(FAILURES, address, per_minute)
        if decision is None or decision.allowed:
            return
        wait_s = max(1.0, decision.retry_after_ms / 1000.0)
        self._blocked[address] = self._clock() + wait_s
        self._blocked.move_to_end(address)
        while len(self._blocked) > MAX_BLOCKED:
            self._blocked.popitem(last=False)
        log.warning("admin_sign_in_blocked", address=address, seconds=round(wait_s, 1))
        raise _blocked(wait_s)

    async def _charge(self, kind: str, who: str, per_minute: int) -> Decision | None:
        lease = Lease(TAG, uuid.uuid4().hex, (Scope(kind, who, Limits(rpm=per_minute)),), 0)
        limiter = self._shared() or self._own
        try:
            return await limiter.charge(lease)
        except LimiterUnavailable:  # fail-closed limiter, Redis away: not counted (docstring)
            return None


def _refused(message: str, decision: Decision) -> ApiError:
    return ApiError(
        429,
        message,
        type_="rate_limit_exceeded",
        code="rate_limit_exceeded",
        headers=decision.headers(),
    )


def _blocked(seconds: float) -> ApiError:
    return ApiError(
        429,
        "too many failed sign-ins from this address; retry later",
        type_="rate_limit_exceeded",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(max(1, math.ceil(seconds)))},
    )
