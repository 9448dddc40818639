"""Migration 0010 on SQLite and PostgreSQL: the tables the models declare, existing tenants
keep storing (``conversation_store`` true), and the downgrade removes all of it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from tenants.conversation_models import CONVERSATION_TABLES
from tenants.db import make_engine
from tenants.migrate import migrate_engine
from tenants.models import Base, UTCDateTime, utcnow
from tests.tenants.test_migrations import fresh_url

__all__ = ["fresh_url"]

# tenants as 0009 left it (the columns without a server default).
OLD_TENANTS = sa.table(
    "tenants",
    *(sa.column(n) for n in ("id", "name", "status", "cache_salt", "widget_max_choices")),
    *(sa.column(n, sa.Boolean()) for n in ("allow_client_system", "widget_require_session")),
    sa.column("widget_allow_client_system", sa.Boolean()),
    sa.column("created_at", UTCDateTime()),
    sa.column("updated_at", UTCDateTime()),
)
OLD_TENANT = {
    "id": "old",
    "name": "Old",
    "status": "active",
    "cache_salt": "s",
    "widget_max_choices": 1,
    "allow_client_system": True,
    "widget_require_session": False,
    "widget_allow_client_system": False,
    "updated_at": utcnow(),
}
TENANT_COLUMNS = {"conversation_store", "conversation_retention_days"}


async def _columns(engine: AsyncEngine) -> dict[str, set[str]]:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda c: {
                t: {col["name"] for col in inspect(c).get_columns(t)}
                for t in inspect(c).get_table_names()
            }
        )


async def test_0010_up_and_down(fresh_url: str) -> None:
    engine = make_engine(fresh_url)
    try:
        await migrate_engine(engine, "upgrade", "0009_sealed_secrets")
        async with engine.begin() as conn:
            await conn.execute(OLD_TENANTS.insert().values(**OLD_TENANT, created_at=utcnow()))
        await migrate_engine(engine, "upgrade", "0010_conversations")
        cols = await _columns(engine)
        for table in CONVERSATION_TABLES:
            assert cols[table] == set(Base.metadata.tables[table].columns.keys()), table
        assert cols["tenants"] >= TENANT_COLUMNS
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT conversation_store FROM tenants"))).one()
        assert bool(row[0]) is True
        await migrate_engine(engine, "downgrade", "0009_sealed_secrets")
        cols = await _columns(engine)
        assert not set(CONVERSATION_TABLES) & set(cols)
        assert not TENANT_COLUMNS & cols["tenants"]
    finally:
        await engine.dispose()


@pytest.mark.parametrize("table", CONVERSATION_TABLES)
def test_tables_known_to_the_models(table: str) -> None:
    assert table in Base.metadata.tables
