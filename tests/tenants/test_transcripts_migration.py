"""Migration 0011 on SQLite and PostgreSQL: existing tenants keep no widget history (off) and
allow transcript reading (on); the downgrade removes both columns."""

from __future__ import annotations

from sqlalchemy import text

from tenants.db import make_engine
from tenants.migrate import migrate_engine
from tenants.models import utcnow
from tests.tenants.test_conversations_migration import OLD_TENANT, OLD_TENANTS, _columns
from tests.tenants.test_migrations import fresh_url

__all__ = ["fresh_url"]

COLUMNS = {"widget_history", "transcripts_enabled"}


async def test_0011_up_and_down(fresh_url: str) -> None:
    engine = make_engine(fresh_url)
    try:
        await migrate_engine(engine, "upgrade", "0010_conversations")
        async with engine.begin() as conn:
            await conn.execute(OLD_TENANTS.insert().values(**OLD_TENANT, created_at=utcnow()))
        await migrate_engine(engine, "upgrade", "0011_widget_history_transcripts")
        assert (await _columns(engine))["tenants"] >= COLUMNS
        async with engine.connect() as conn:
            query = "SELECT widget_history, transcripts_enabled FROM tenants"
            row = (await conn.execute(text(query))).one()
            assert (bool(row[0]), bool(row[1])) == (False, True)
            # a row written without them (an older replica during a rolling upgrade) too
            await conn.execute(
                OLD_TENANTS.insert().values(**{**OLD_TENANT, "id": "new"}, created_at=utcnow())
            )
            new = (await conn.execute(text(f"{query} WHERE id = 'new'"))).one()
            assert (bool(new[0]), bool(new[1])) == (False, True)
            await conn.rollback()
        await migrate_engine(engine, "downgrade", "0010_conversations")
        assert not COLUMNS & (await _columns(engine))["tenants"]
    finally:
        await engine.dispose()
