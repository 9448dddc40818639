"""The leases one limiter backend holds for this process, and their batched renewal.

Each backend keeps a ``LeaseBook``::

    begin(lease)      admission call about to start      -> in doubt
    admitted(lease)   the call answered "allowed"        -> live (renewed until released)
    rejected(lease)   the call answered "rejected"       -> forgotten (nothing to give back)
    finish(lease)     release: LIVE (with its hold time and charge weight), DOUBT or NONE

A lease stays "in doubt" when its admission call did not answer (timeout, cancellation, lost
connection): the backend may or may not have recorded it, so release must undo it blindly.

One ``Renewer`` task per backend extends every live lease's TTL each ``ttl / 3`` in one batch,
so a lease outlives a crashed gateway by at most one TTL, and a long request never loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Awaitable, Callable

import structlog

from gateway.ratelimit.types import Lease

log = structlog.get_logger(__name__)


class Held(enum.Enum):
    NONE = 0  # never admitted, or already released
    DOUBT = 1  # the admission call did not answer
    LIVE = 2


class LeaseBook:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # lease id -> lease, admitted at (s), weight its charges were made with
        self._live: dict[str, tuple[Lease, float, float]] = {}
        self._doubt: set[str] = set()

    def begin(self, lease: Lease) -> None:
        self._doubt.add(lease.lease_id)

    def admitted(self, lease: Lease, weight: float = 1.0) -> None:
        self._doubt.discard(lease.lease_id)
        self._live[lease.lease_id] = (lease, self._clock(), weight)

    def extended(self, lease: Lease) -> None:
        """``lease`` reserves more now (``Limiter.extend``): kept with its admission record."""
        live = self._live.get(lease.lease_id)
        if live is not None:
            self._live[lease.lease_id] = (lease, live[1], live[2])

    def rejected(self, lease: Lease) -> None:
        self._doubt.discard(lease.lease_id)

    def finish(self, lease: Lease) -> tuple[Held, float, float]:
        """Forget the lease: what it was; for a live one how long it was held (ms) and the
        weight its charges were made with."""
        live = self._live.pop(lease.lease_id, None)
        if live is not None:
            return Held.LIVE, (self._clock() - live[1]) * 1000.0, live[2]
        if lease.lease_id in self._doubt:
            self._doubt.discard(lease.lease_id)
            return Held.DOUBT, 0.0, 1.0
        return Held.NONE, 0.0, 1.0

    def live(self) -> list[Lease]:
        return [entry[0] for entry in self._live.values()]

    def __len__(self) -> int:
        return len(self._live) + len(self._doubt)

    def check_integrity(self) -> None:
        for lease_id, (lease, since, weight) in self._live.items():
            assert lease.lease_id == lease_id, f"lease {lease.lease_id} filed under {lease_id}"
            assert lease_id not in self._doubt, f"lease {lease_id} both live and in doubt"
            assert since >= 0 and weight >= 1.0, f"bad admission record of {lease_id}"


class Renewer:
    """Calls ``renew(live leases)`` every ``interval_s`` while any lease is live."""

    def __init__(
        self,
        book: LeaseBook,
        renew: Callable[[list[Lease]], Awaitable[None]],
        interval_s: float,
    ) -> None:
        self._book = book
        self._renew = renew
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0

    def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            leases = self._book.live()
            if not leases:
                continue
            try:
                await self._renew(leases)
                self.rounds += 1
            except Exception as exc:  # the backend is away: its TTL decides, as intended
                log.debug("ratelimit_renew_failed", error=type(exc).__name__, leases=len(leases))

    async def close(self) -> None:
        task, self._task = self._task, None
        while task is not None and not task.done():
            # Cancelled again while not done: on Python 3.11, asyncio.wait_for (which redis-py
            # sends with when its client has a socket timeout) can swallow a cancellation
            # that arrives as the send completes, and the loop would go on.
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
