"""Schema migrations from code: upgrade to head, and the start-up schema check.

Alembic is configured here, not from alembic.ini: ``script_location`` is the ``migrations``
package directory, so it works from any working directory. Migrations run on a connection of
the caller's async engine (``run_sync``), so these helpers work inside a running event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
from collections.abc import AsyncIterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tenants.db import is_unavailable, make_engine, unavailable
from tenants.errors import SchemaOutdated
from tenants.secret_keys import SecretsSettings


def script_location() -> Path:
    """The ``migrations`` package directory (regular or namespace package, any cwd)."""
    import migrations

    for entry in migrations.__path__:
        if (Path(entry) / "env.py").is_file():
            return Path(entry)
    raise RuntimeError(f"no Alembic env.py found in {list(migrations.__path__)}")


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    return cfg


def head_revisions() -> set[str]:
    return set(ScriptDirectory.from_config(alembic_config()).get_heads())


def _run(connection: Connection, op: str, target: str, secrets: SecretsSettings | None) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    # where the secrets key comes from, when a migration must seal or open stored secrets
    # (migrations/versions/0009_*); None: the migration reads the environment
    cfg.attributes["secrets"] = secrets
    getattr(command, op)(cfg, target)


# pg_advisory_xact_lock key of schema migrations ("kvgatemg" in ASCII), one per database.
PG_MIGRATION_LOCK = 0x6B76_6761_7465_6D67


@contextlib.asynccontextmanager
async def _migration_lock(engine: AsyncEngine) -> AsyncIterator[None]:
    """SQLite file: an exclusive lock on ``<file>.migrate.lock`` for the migration. SQLite
    transactions start deferred, so without it two processes on a fresh file both read "no
    schema" before either takes the write lock, and the second then fails with "table ...
    already exists". PostgreSQL: an advisory lock taken inside the migration's transaction
    (``_LOCK_PG``). Other SQLite URLs (memory, ``file:``): no lock."""
    db = engine.url.database if engine.dialect.name == "sqlite" else None
    if not db or db == ":memory:" or db.startswith("file:"):
        yield
        return
    with open(f"{db}.migrate.lock", "a") as lock:
        await asyncio.to_thread(fcntl.flock, lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


# Replicas migrating one database at once: the first to get the lock migrates; the others wait
# for its commit (the lock is released with the transaction), then read the schema it left and
# find nothing to do. DDL is transactional in PostgreSQL, so a failed migration leaves nothing.
_LOCK_PG = text("SELECT pg_advisory_xact_lock(:key)")


async def migrate_engine(
    engine: AsyncEngine,
    op: str = "upgrade",
    target: str = "head",
    secrets: SecretsSettings | None = None,
) -> None:
    """Run ``alembic <op> <target>`` (op: upgrade | downgrade) in one transaction."""
    try:
        async with _migration_lock(engine), engine.connect() as conn:
            sqlite = conn.dialect.name == "sqlite"
            if sqlite:
                await _sqlite_foreign_keys(conn, on=False)
            try:
                async with conn.begin():
                    if conn.dialect.name == "postgresql":
                        await conn.execute(_LOCK_PG, {"key": PG_MIGRATION_LOCK})
                    await conn.run_sync(_run, op, target, secrets)
                    if sqlite:
                        await _check_foreign_keys(conn)
            finally:
                if sqlite:
                    await _sqlite_foreign_keys(conn, on=True)
    except Exception as exc:
        if is_unavailable(exc):
            raise unavailable(exc) from exc
        raise


async def _sqlite_foreign_keys(conn: AsyncConnection, *, on: bool) -> None:
    """SQLite's foreign keys off while migrating: batch mode rebuilds a table (copy, DROP, rename),
    and with them on the DROP deletes every row, cascading into each table that refers to it
    (a tenant's keys, prompts and MCP servers). Outside a transaction: SQLite ignores the pragma
    inside one."""
    await conn.exec_driver_sql(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    await conn.commit()


async def _check_foreign_keys(conn: AsyncConnection) -> None:
    """The references the migration left must hold (else it is rolled back)."""
    broken = (await conn.exec_driver_sql("PRAGMA foreign_key_check")).fetchall()
    if broken:
        raise RuntimeError(
            f"migration left {len(broken)} broken references, e.g. {tuple(broken[0])}"
        )


async def upgrade_to_head(url: str, secrets: SecretsSettings | None = None) -> None:
    """Bring the database at ``url`` to the newest schema (used by ``kvgate migrate`` and by the
    embedded SQLite default, which migrates itself on first start)."""
    engine = make_engine(url)
    try:
        await migrate_engine(engine, "upgrade", "head", secrets)
    finally:
        await engine.dispose()


async def current_revisions(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        heads = await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_heads())
    return set(heads)


async def schema_is_current(engine: AsyncEngine) -> bool:
    return await current_revisions(engine) == head_revisions()


async def check_schema(engine: AsyncEngine) -> None:
    """Raise ``SchemaOutdated`` (message says to run ``kvgate migrate``) unless at head."""
    try:
        current = await current_revisions(engine)
    except Exception as exc:
        if is_unavailable(exc):
            raise unavailable(exc) from exc
        raise
    expected = head_revisions()
    if current != expected:
        have = ", ".join(sorted(current)) or "empty (no schema)"
        raise SchemaOutdated(
            f"tenant database schema is at {have}; this version needs "
            f"{', '.join(sorted(expected))}: run `kvgate migrate`"
        )


async def prepare_schema(engine: AsyncEngine) -> None:
    """Start-up policy: SQLite (the embedded default) migrates itself to head; any other database
    must already be at head, else ``SchemaOutdated`` tells the operator to run `kvgate migrate`."""
    if engine.dialect.name == "sqlite":
        await migrate_engine(engine, "upgrade", "head")
    else:
        await check_schema(engine)
