"""Engine and session factory; maps "database unreachable" to ``StoreUnavailable``; URLs as they
may be shown (``redact_url``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from tenants.errors import StoreUnavailable

SessionFactory = async_sessionmaker[AsyncSession]
T = TypeVar("T")
_SECRET_QUERY_KEYS = ("pass", "secret", "token", "key")  # ?password=, ?sslkey=, ...


def redact_url(url: str) -> str:
    """``url`` as a message or log line may show it (database and Redis URLs alike): the
    password as ``***``, query values whose name looks secret as ``redacted``; a string that
    does not parse as a URL is not echoed at all (it may be a password in the wrong place)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return "<not a URL>"
    query = {
        k: "redacted" if any(s in k.lower() for s in _SECRET_QUERY_KEYS) else v
        for k, v in parsed.query.items()
    }
    return parsed.set(query=query).render_as_string(hide_password=True)


def make_engine(
    url: str, *, timeout_s: float | None = None, connect_timeout_s: float = 5.0, **kwargs: Any
) -> AsyncEngine:
    """Create the async engine. SQLite: creates the file's directory, enables foreign keys
    and a busy timeout so concurrent writers wait instead of failing.

    ``timeout_s`` (the request path's database deadline; None for migrations and the CLI, whose
    statements may run long): the connect timeout, the pool checkout timeout, asyncpg's
    ``command_timeout`` (client side: a server that stops answering with the TCP connection
    open still fails the statement) and PostgreSQL's ``statement_timeout`` (server side); for
    SQLite, the busy timeout. PostgreSQL also ends transactions a vanished client left open
    (``idle_in_transaction_session_timeout``), so their locks do not outlive an outage.

    Statement parameters are kept out of exception messages and SQL logs (``hide_parameters``):
    they include prompt text, cache salts and key hashes, and a failed statement is logged."""
    kwargs.setdefault("hide_parameters", True)
    connect_s = connect_timeout_s if timeout_s is None else min(connect_timeout_s, timeout_s)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if timeout_s is not None and db and db != ":memory:":
            kwargs.setdefault("pool_timeout", timeout_s)  # a queue pool only for files
        return _sqlite_engine(url, db, timeout_s or connect_timeout_s, **kwargs)
    connect_args: dict[str, Any] = {"timeout": connect_s}  # asyncpg's connect timeout
    if timeout_s is not None:
        ms = str(int(timeout_s * 1000))
        connect_args["command_timeout"] = timeout_s
        connect_args["server_settings"] = {
            "statement_timeout": ms,
            "idle_in_transaction_session_timeout": str(int(timeout_s * 4000)),
        }
        kwargs.setdefault("pool_timeout", timeout_s)
    return create_async_engine(url, pool_pre_ping=True, connect_args=connect_args, **kwargs)


def _sqlite_engine(url: str, db: str | None, busy_s: float, **kwargs: Any) -> AsyncEngine:
    if db and db != ":memory:":
        Path(db).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url, connect_args={"timeout": busy_s}, **kwargs)
    busy_ms = int(busy_s * 1000)

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={busy_ms}")
        cur.close()

    event.listen(engine.sync_engine, "connect", on_connect)
    if db and db != ":memory:":
        # WAL: readers (the request path) do not wait for a writer (the admin API).
        event.listen(engine.sync_engine, "connect", _sqlite_wal)
    return engine


def _sqlite_wal(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


async def within(seconds: float | None, work: Awaitable[T]) -> T:
    """``await work``, but for at most ``seconds`` (None: no bound). On expiry the work is
    cancelled and ``TimeoutError`` raised at once (``is_unavailable`` counts it as an outage):
    the cancelled work's own clean-up (rolling back on a connection that stopped answering)
    finishes in the background instead of extending the wait. Its transaction never commits."""
    if seconds is None:
        return await work
    task = asyncio.ensure_future(work)
    try:
        async with asyncio.timeout(seconds):
            return await asyncio.shield(task)
    except BaseException:
        task.cancel()
        task.add_done_callback(_consume)
        raise


def _consume(task: asyncio.Future[Any]) -> None:
    """The cut work's own end (its clean-up failing too, as a rollback on a dead connection
    does) is expected: retrieved, so asyncio does not log it as a lost "Task exception was
    never retrieved" error, once per unit of work an outage cut."""
    if not task.cancelled():
        task.exception()


def make_session_factory(engine: AsyncEngine) -> SessionFactory:
    # expire_on_commit=False: results stay readable after the unit of work commits.
    return async_sessionmaker(engine, expire_on_commit=False)


# SQLSTATE classes and codes of PostgreSQL errors that say "not now" rather than "wrong request":
# 08 connection exception, 53 insufficient resources (too many connections, out of memory),
# 57 operator intervention (57014 statement timeout / cancel, shutdown, cannot connect now),
# 25P03 idle-in-transaction timeout.
_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57")
_UNAVAILABLE_SQLSTATES = ("25P03",)


def is_unavailable(exc: BaseException) -> bool:
    """True for failures meaning "the database cannot be reached or used right now"."""
    if isinstance(exc, OperationalError | InterfaceError | OSError | TimeoutError):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    state = str(getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None) or "")
    if state[:2] in _UNAVAILABLE_SQLSTATE_CLASSES or state in _UNAVAILABLE_SQLSTATES:
        return True
    return exc.connection_invalidated


def unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"tenant database unavailable ({type(exc).__name__})")
