"""Engine and session factory; maps "database unreachable" to ``StoreUnavailable``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from tenants.errors import StoreUnavailable

SessionFactory = async_sessionmaker[AsyncSession]


def make_engine(url: str, *, connect_timeout_s: float = 5.0, **kwargs: Any) -> AsyncEngine:
    """Create the async engine. SQLite: creates the file's directory, enables foreign keys
    and a busy timeout so concurrent writers wait instead of failing.

    Statement parameters are kept out of exception messages and SQL logs (``hide_parameters``):
    they include prompt text, cache salts and key hashes, and a failed statement is logged."""
    kwargs.setdefault("hide_parameters", True)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            Path(db).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": connect_timeout_s}, **kwargs)
        event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
        if db and db != ":memory:":
            # WAL: readers (the request path) do not wait for a writer (the admin API).
            event.listen(engine.sync_engine, "connect", _sqlite_wal)
        return engine
    connect_args = {"timeout": connect_timeout_s}  # asyncpg's connect timeout
    return create_async_engine(url, pool_pre_ping=True, connect_args=connect_args, **kwargs)


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.close()


def _sqlite_wal(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def make_session_factory(engine: AsyncEngine) -> SessionFactory:
    # expire_on_commit=False: results stay readable after the unit of work commits.
    return async_sessionmaker(engine, expire_on_commit=False)


def is_unavailable(exc: BaseException) -> bool:
    """True for failures meaning "the database cannot be reached or used right now"."""
    if isinstance(exc, OperationalError | InterfaceError | OSError | TimeoutError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"tenant database unavailable ({type(exc).__name__})")
