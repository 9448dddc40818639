"""Migration 0012 on SQLite and PostgreSQL: existing tenants keep the tenant-wide vLLM cache
salt (``vllm_visitor_salt`` off); the downgrade removes the column."""

from __future__ import annotations

from sqlalchemy import text

from tenants.db import make_engine
from tenants.migrate import migrate_engine
from tenants.models import utcnow
from tests.tenants.test_conversations_migration import OLD_TENANT, OLD_TENANTS, _columns
from tests.tenants.test_migrations import fresh_url

__all__ = ["fresh_url"]

QUERY = "SELECT vllm_visitor_salt FROM tenants"


async def test_0012_up_and_down(fresh_url: str) -> None:
    engine = make_engine(fresh_url)
    try:
        await migrate_engine(engine, "upgrade", "0011_widget_history_transcripts")
        async with engine.begin() as conn:
            await conn.execute(OLD_TENANTS.insert().values(**OLD_TENANT, created_at=utcnow()))
        await migrate_engine(engine, "upgrade", "0012_vllm_visitor_salt")
        assert "vllm_visitor_salt" in (await _columns(engine))["tenants"]
        async with engine.connect() as conn:
            assert bool((await conn.execute(text(QUERY))).scalar_one()) is False
            # a row written without it (an older replica during a rolling upgrade) too
            await conn.execute(
                OLD_TENANTS.insert().values(**{**OLD_TENANT, "id": "new"}, created_at=utcnow())
            )
            new = (await conn.execute(text(f"{QUERY} WHERE id = 'new'"))).scalar_one()
            assert bool(new) is False
            await conn.rollback()
        await migrate_engine(engine, "downgrade", "0011_widget_history_transcripts")
        assert "vllm_visitor_salt" not in (await _columns(engine))["tenants"]
    finally:
        await engine.dispose()
