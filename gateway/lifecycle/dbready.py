"""The tenant database's part of ``/readyz``: reachable, degraded (serving last-known-good) or down.

The probe is one ``SELECT 1`` bounded by ``min(1 s, KVGATE_DB_TIMEOUT_S)``, so ``/readyz`` answers
within about a second whatever the database does. An unreachable database does not make the
gateway unready while known keys and tenants can still be served from last-known-good state
(``KVGATE_DB_STALE_MAX_S``); past that, the check fails.

``/readyz`` is public, so its answer is cached (``DatabaseProbe``): a probe is reused for
``PROBE_MAX_AGE_S`` and shared by the calls that arrive while it runs, so however often it is
called the database sees at most about one ``SELECT 1`` per second from it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.access.auth import KeyCache
from tenants.store import TenantStore

PROBE_TIMEOUT_S = 1.0
PROBE_MAX_AGE_S = 1.0


@dataclass(frozen=True)
class DatabaseReadiness:
    status: str  # "ok" | "degraded" (unreachable, serving last-known-good) | "down"
    reachable: bool
    outage_s: float | None  # how long the database has been unreachable
    stale_max_s: float  # how long last-known-good state may be served
    error: str | None  # exception class of the last failure
    oldest_read_s: float | None = None  # age of the oldest cached entry served meanwhile

    @property
    def passing(self) -> bool:
        return self.status != "down"

    def report(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reachable": self.reachable,
            "serving_last_known_good": self.status == "degraded",
            "outage_s": None if self.outage_s is None else round(self.outage_s, 3),
            "stale_max_s": self.stale_max_s,
            "oldest_cached_read_s": None
            if self.oldest_read_s is None
            else round(self.oldest_read_s, 3),
            "error": self.error,
        }


async def database_readiness(store: TenantStore, keys: KeyCache) -> DatabaseReadiness:
    timeout = min(PROBE_TIMEOUT_S, store.deadline_s or PROBE_TIMEOUT_S)
    reachable = await store.ping(timeout)
    snap = store.health.snapshot()
    if reachable:
        return DatabaseReadiness("ok", True, None, keys.stale_max_s, None)
    outage = snap.down_for_s or 0.0
    status = "degraded" if outage <= keys.stale_max_s else "down"
    return DatabaseReadiness(
        status, False, outage, keys.stale_max_s, snap.last_error, keys.oldest_read_age()
    )


class DatabaseProbe:
    """``database_readiness`` at most once per ``max_age_s``, one probe at a time."""

    def __init__(
        self, max_age_s: float = PROBE_MAX_AGE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max_age = max_age_s
        self._clock = clock
        self._last: DatabaseReadiness | None = None
        self._last_at = 0.0  # clock reading when the last probe ended
        self._running: asyncio.Task[DatabaseReadiness] | None = None
        self.probes = 0  # probes run (tests check the cache works)

    async def readiness(self, store: TenantStore, keys: KeyCache) -> DatabaseReadiness:
        if self._last is not None and self._clock() - self._last_at < self._max_age:
            return self._last
        if self._running is None:
            self._running = asyncio.ensure_future(self._probe(store, keys))
        # Shielded: a caller that goes away does not cancel the probe the others wait on.
        return await asyncio.shield(self._running)

    async def _probe(self, store: TenantStore, keys: KeyCache) -> DatabaseReadiness:
        self.probes += 1
        try:
            result = await database_readiness(store, keys)
        finally:
            self._running = None
        self._last, self._last_at = result, self._clock()
        return result


DB_PROBE = web.AppKey("database_probe", DatabaseProbe)
