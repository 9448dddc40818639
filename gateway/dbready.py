"""The tenant database's part of ``/readyz``: reachable, degraded (serving last-known-good) or down.

The probe is one ``SELECT 1`` bounded by ``min(1 s, KVGATE_DB_TIMEOUT_S)``, so ``/readyz`` answers
within about a second whatever the database does. An unreachable database does not make the
gateway unready while known keys and tenants can still be served from last-known-good state
(``KVGATE_DB_STALE_MAX_S``); past that, the check fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.auth import KeyCache
from tenants.store import TenantStore

PROBE_TIMEOUT_S = 1.0


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
