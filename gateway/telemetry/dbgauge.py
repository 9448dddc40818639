"""The tenant database's health as two scrape-time gauges, by the same rule as ``/readyz``.

    kvgate_database_up             1 while the last unit of work or /readyz probe reached it
    kvgate_database_serving_stale  1 while it is out and known keys and tenants are answered
                                   from last-known-good (for at most KVGATE_DB_STALE_MAX_S);
                                   0 again past that (every request is then refused with 503)

Read from ``DbHealth`` (tenants/health.py) without touching the database: a scrape never waits.
"""

from __future__ import annotations

from dataclasses import dataclass

from tenants.health import DbHealth


@dataclass(frozen=True)
class DatabaseGauge:
    up: bool
    serving_stale: bool


def database_gauge(health: DbHealth, stale_max_s: float) -> DatabaseGauge:
    """``up`` as ``DbHealth`` knows it; ``serving_stale`` while down for at most ``stale_max_s``
    (``/readyz`` calls that state "degraded", gateway/lifecycle/dbready.py)."""
    snap = health.snapshot()
    if snap.up:
        return DatabaseGauge(True, False)
    return DatabaseGauge(False, (snap.down_for_s or 0.0) <= stale_max_s)
