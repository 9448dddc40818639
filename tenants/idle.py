"""The idle connections of a PostgreSQL engine's pool, closed at once when an outage is seen.

Why: a pooled connection that a partition cut may stay silent for good after the network is
back (a firewall, NAT or load balancer between forgot it and drops its packets without a
reset). ``pool_pre_ping`` then waits the whole database deadline on it, and a ping timeout is no
disconnect to SQLAlchemy: the unit of work fails and the pool keeps its other idle connections.
While the database is marked down one unit per retry interval tries it (tenants/health.py), so
the idle connections were used up one failed trial at a time: after a partition of seconds the
admin API kept failing for pool size x (deadline + retry interval), 20 s with the defaults,
though the database was back (tests/reliability/test_database.py).

So the first unit of work (or readiness probe) that cannot reach the database closes every idle
connection at once, with asyncpg's ``terminate`` (no goodbye to wait for: the peer may be
silent). The pool keeps their entries; the next pre-ping of each finds a closed connection, a
disconnect, and SQLAlchemy replaces it within that same checkout. Connections in use at that
moment are the failing units' own: SQLAlchemy invalidates them when they fail.

Healthy idle connections closed this way (the outage was a slow statement) cost one connect
each when next used. SQLite has no network between and no such pool: nothing is tracked.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import AdaptedConnection
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import ConnectionPoolEntry


class IdleConnections:
    """The pool's checked-in connections, kept by PoolEvents (checkin adds, checkout and close
    remove); ``close_all`` terminates them."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._idle: dict[int, ConnectionPoolEntry] = {}
        self.closed = 0  # connections close_all terminated, in all
        target = engine.sync_engine
        event.listen(target, "checkin", self._checkin)
        event.listen(target, "checkout", self._checkout)
        event.listen(target, "close", self._gone)

    @classmethod
    def of(cls, engine: AsyncEngine) -> IdleConnections | None:
        return None if engine.dialect.name == "sqlite" else cls(engine)

    def _checkin(self, dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        if dbapi_connection is not None:  # None: invalidated, it holds no connection
            self._idle[id(record)] = record

    def _checkout(self, _dbapi_connection: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        self._idle.pop(id(record), None)

    def _gone(self, _dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        self._idle.pop(id(record), None)

    def __len__(self) -> int:
        return len(self._idle)

    def close_all(self) -> None:
        """Terminate every idle connection now (the entries stay in the pool, closed)."""
        records, self._idle = list(self._idle.values()), {}
        for record in records:
            adapted = record.dbapi_connection
            if not isinstance(adapted, AdaptedConnection):
                continue
            driver = adapted.driver_connection  # the asyncpg connection
            if not driver.is_closed():
                driver.terminate()
                self.closed += 1
