"""Rate-limit vocabulary shared by the Redis, in-process and fail-over limiters.

One admission checks a list of *scopes* (the tenant; the API key when it has limits of its own;
the visitor of widget traffic), all in one atomic step. Each scope has three limits:

    requests per minute (RPM)   GCRA, burst = the whole minute's allowance
    tokens per minute (TPM)     GCRA on tokens; admission reserves prompt + max output tokens,
                                release reconciles with the real usage (refund or extra charge)
    concurrency                 leases with a short TTL, renewed while the request runs (a crashed
                                replica's leases expire by themselves); a lease takes ``slots``
                                of the limit (a request of n choices runs n engine requests:
                                n slots), and one wider than the limit is never admissible

A limit of 0 means unlimited; its dimension is skipped and reports no headers. A request is
admitted only if every scope admits it; nothing is taken from any scope otherwise.

Lease life cycle: the caller makes the ``Lease`` (its id) *before* the admission call and
releases it in a ``finally`` whatever happened to that call (admitted, rejected, timed out,
cancelled). ``release`` is idempotent and safe for a lease that was never admitted.

Refusals: a request refused after authentication but before admission (too long, bad body) is
*charged*: one request from the RPM of each of its scopes, so a client cannot loop refusals for
free (``charge``; no tokens, no lease).
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from dataclasses import dataclass
from typing import Protocol

PERIOD_MS = 60_000.0  # both RPM and TPM refill over one minute
# A debt within this many ms of PERIOD_MS counts as within it, in both limiters: float rounding of
# TATs (sums on a clock of large magnitude) must not refuse the last request a limit allows.
SLACK_MS = 0.01
MAX_SLOTS = 1024  # concurrency slots one lease may take (a request's n is at most 128)

# Reasons for a rejection, in the order the limiter checks them.
REASON_REQUESTS = "requests"
REASON_TOKENS = "tokens"
REASON_CONCURRENCY = "concurrency"
REASON_TOO_LARGE = "too_large"  # tokens of one request exceed the whole TPM: never admissible
REASON_TOO_WIDE = "too_wide"  # slots of one lease exceed max_concurrency: never admissible
REASONS = (
    None,
    REASON_REQUESTS,
    REASON_TOKENS,
    REASON_CONCURRENCY,
    REASON_TOO_LARGE,
    REASON_TOO_WIDE,
)

# Scope kinds, outermost first (the order an admission lists them in).
SCOPE_TENANT = "tenant"
SCOPE_KEY = "key"
SCOPE_VISITOR = "visitor"


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

    def share(self, fraction: float) -> Limits:
        """Each limit times ``fraction``, rounded down but never below 1 (0 stays unlimited)."""
        return Limits(*(_part(v, fraction) for v in (self.rpm, self.tpm, self.max_concurrency)))


def _part(limit: int, fraction: float) -> int:
    return 0 if limit == 0 else max(1, math.floor(limit * fraction))


@dataclass(frozen=True)
class Scope:
    """One set of limits an admission must fit in. ``id`` is unique within the tenant and kind
    (tenant: the tenant id; key: the key id; visitor: a hash of the end user or client address)."""

    kind: str  # SCOPE_TENANT | SCOPE_KEY | SCOPE_VISITOR
    id: str
    limits: Limits


@dataclass(frozen=True)
class Lease:
    """One admission attempt: made before the call, released exactly once in ``finally``.

    Every scope of a lease lives under ``tenant`` (the Redis cluster hash tag), so one script
    call checks and takes them all. ``slots``: how much of each scope's ``max_concurrency`` the
    lease holds (the engine requests it runs at once), taken and given back together."""

    tenant: str
    lease_id: str
    scopes: tuple[Scope, ...]
    reserved_tokens: int
    slots: int = 1

    def __post_init__(self) -> None:
        assert 1 <= self.slots <= MAX_SLOTS, f"lease slots {self.slots} outside 1..{MAX_SLOTS}"

    @classmethod
    def new(cls, tenant: str, scopes: tuple[Scope, ...], tokens: int, slots: int = 1) -> Lease:
        assert scopes and scopes[0].kind == SCOPE_TENANT, "the tenant scope comes first"
        return cls(tenant, uuid.uuid4().hex, scopes, tokens, slots)

    def grown(self, tokens: int) -> Lease:
        """This lease reserving ``tokens`` more (``Limiter.extend``)."""
        return dataclasses.replace(self, reserved_tokens=self.reserved_tokens + tokens)

    @classmethod
    def single(cls, tenant: str, limits: Limits, tokens: int, slots: int = 1) -> Lease:
        """A lease with the tenant scope alone (tools, benchmarks)."""
        return cls.new(tenant, (Scope(SCOPE_TENANT, tenant, limits),), tokens, slots)

    def wider_than(self, scope: Scope) -> bool:
        """Whether this lease needs more slots than ``scope`` ever has (never admissible)."""
        conc = scope.limits.max_concurrency
        return conc > 0 and self.slots > conc


@dataclass(frozen=True)
class Quota:
    """One dimension after a decision: what the x-ratelimit-* headers report."""

    limit: int
    remaining: int
    reset_ms: float  # time until this dimension is fully replenished (the GCRA debt)


@dataclass(frozen=True)
class ScopeState:
    """One scope's quotas after a decision (None: that dimension is unlimited)."""

    kind: str
    requests: Quota | None
    tokens: Quota | None


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str | None
    scope: str | None  # the rejecting scope's kind; when allowed, the most restrictive one
    requests: Quota | None  # the most restrictive scope's (the rejecting scope's when rejected)
    tokens: Quota | None
    retry_after_ms: float  # 0 when allowed; -1 when never admissible
    lease: Lease | None  # set exactly when an admission allowed it (never for a charge)
    states: tuple[ScopeState, ...] = ()  # per scope, in the lease's order

    @classmethod
    def of(
        cls,
        lease: Lease,
        states: tuple[ScopeState, ...],
        reason: str | None,
        rejecting: int | None,
        retry_after_ms: float,
    ) -> Decision:
        """Headers come from the rejecting scope, else from the least remaining per dimension."""
        if rejecting is not None:
            picked = states[rejecting]
            requests, tokens, scope = picked.requests, picked.tokens, picked.kind
        else:
            requests, tokens, scope = _most_restrictive(states)
        return cls(
            allowed=reason is None,
            reason=reason,
            scope=scope,
            requests=requests,
            tokens=tokens,
            retry_after_ms=0.0 if reason is None else retry_after_ms,
            lease=lease if reason is None else None,
            states=states,
        )

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for suffix, quota in (("requests", self.requests), ("tokens", self.tokens)):
            if quota is None:
                continue
            out[f"x-ratelimit-limit-{suffix}"] = str(quota.limit)
            out[f"x-ratelimit-remaining-{suffix}"] = str(max(0, quota.remaining))
            out[f"x-ratelimit-reset-{suffix}"] = format_duration(quota.reset_ms)
        if self.scope is not None:
            out["x-ratelimit-scope"] = self.scope
        if not self.allowed and self.retry_after_ms >= 0:
            out["Retry-After"] = str(max(1, math.ceil(self.retry_after_ms / 1000.0)))
        return out


def _most_restrictive(states: tuple[ScopeState, ...]) -> tuple[Quota | None, Quota | None, str]:
    def fraction(q: Quota | None) -> float:
        return 2.0 if q is None else q.remaining / q.limit

    requests = min((s.requests for s in states if s.requests), key=fraction, default=None)
    tokens = min((s.tokens for s in states if s.tokens), key=fraction, default=None)
    tightest = min(states, key=lambda s: min(fraction(s.requests), fraction(s.tokens)))
    return requests, tokens, tightest.kind


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


@dataclass(frozen=True)
class SharedState:
    """A limiter that shares its state through Redis and falls back in-process: whether Redis
    is away now, and the fail-over counters (read by /readyz and the metrics)."""

    down: bool
    fail_open: bool  # while down: admit in-process (True) or refuse (False)
    failovers: int  # UP -> DOWN transitions
    fallback_decisions: int  # admissions decided in-process while down


class Limiter(Protocol):
    async def acquire(self, lease: Lease) -> Decision:
        """Check every scope of ``lease`` and, if all admit, take from all of them."""
        ...

    async def charge(self, lease: Lease) -> Decision:
        """Take one request from the RPM of every scope of ``lease`` (a request refused before
        admission: it costs its client as an admitted one would), or from none when a scope has
        no room (``allowed`` false, reason "requests"). Takes no tokens and holds no lease: the
        decision's ``lease`` is None, there is nothing to release."""
        ...

    async def extend(self, lease: Lease, tokens: int) -> Decision:
        """Reserve ``tokens`` more TPM for a lease still held (a later step of a request: the
        gateway's tool loop), from every scope or from none; no request and no concurrency slot
        is taken. Allowed: the decision's ``lease`` is ``lease`` reserving ``tokens`` more, the
        one to release. Refused (reason "tokens", "too_large", or "concurrency" when the lease
        is no longer held): nothing is taken and ``lease`` stays as it was."""
        ...

    async def release(self, lease: Lease, used_tokens: int) -> None:
        """Give the lease back and reconcile TPM with ``used_tokens``. Idempotent; a no-op for a
        lease that was rejected; for one whose admission call did not complete, undoes whatever
        that call may still have taken."""
        ...

    async def warm(self) -> None:
        """Connect and load what admission needs, before the first request (no-op in-process).
        A fail-closed shared limiter whose store is unreachable raises LimiterUnavailable."""
        ...

    def shared_state(self) -> SharedState | None:
        """The fail-over state of a shared limiter; None for one with nothing to fail over."""
        ...

    async def ping(self) -> bool:
        """Whether the shared store answers now (True for an in-process limiter)."""
        ...

    async def close(self) -> None: ...
