from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from tenants.db import make_engine
from tenants.errors import SchemaOutdated, StoreUnavailable
from tenants.migrate import (
    check_schema,
    head_revisions,
    migrate_engine,
    prepare_schema,
    schema_is_current,
    upgrade_to_head,
)
from tenants.models import ALL_TABLES, Base
from tests.tenants.fixtures import PG_URL_TEMPLATE, create_pg_database, drop_pg_database

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (not the shared migrated one)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
        return
    name = create_pg_database()
    try:
        yield PG_URL_TEMPLATE.format(name=name)
    finally:
        drop_pg_database(name)


async def _tables(engine) -> set[str]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))


async def test_upgrade_downgrade_round_trip(fresh_url: str) -> None:
    engine = make_engine(fresh_url)
    try:
        assert not await schema_is_current(engine)
        with pytest.raises(SchemaOutdated, match="run `kvgate migrate`"):
            await check_schema(engine)
        await upgrade_to_head(fresh_url)
        assert await schema_is_current(engine)
        await check_schema(engine)
        assert set(ALL_TABLES) <= await _tables(engine)
        await migrate_engine(engine, "downgrade", "base")
        assert not await schema_is_current(engine)
        assert not (set(ALL_TABLES) & await _tables(engine))
        await migrate_engine(engine, "upgrade", "head")
        assert await schema_is_current(engine)
        # The migration creates exactly what the models declare.
        async with engine.connect() as conn:
            cols = await conn.run_sync(
                lambda c: {
                    t: {col["name"] for col in inspect(c).get_columns(t)} for t in ALL_TABLES
                }
            )
        for table in ALL_TABLES:
            assert cols[table] == set(Base.metadata.tables[table].columns.keys()), table
    finally:
        await engine.dispose()


async def test_prepare_schema_policy(fresh_url: str) -> None:
    """Embedded SQLite migrates itself at start-up; PostgreSQL must be migrated by the operator."""
    engine = make_engine(fresh_url)
    try:
        if engine.dialect.name == "sqlite":
            await prepare_schema(engine)
            assert await schema_is_current(engine)
        else:
            with pytest.raises(SchemaOutdated, match="kvgate migrate"):
                await prepare_schema(engine)
            await upgrade_to_head(fresh_url)
            await prepare_schema(engine)
        await prepare_schema(engine)  # at head: nothing to do
    finally:
        await engine.dispose()


async def test_check_schema_unreachable() -> None:
    engine = make_engine("postgresql+asyncpg://postgres@127.0.0.1:1/none")
    try:
        with pytest.raises(StoreUnavailable):
            await check_schema(engine)
    finally:
        await engine.dispose()


def test_alembic_command_line_from_another_cwd(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    env = {**os.environ, "KVGATE_DATABASE_URL": f"sqlite+aiosqlite:///{db}"}
    alembic = [sys.executable, "-m", "alembic", "-c", str(REPO / "alembic.ini")]
    out = subprocess.run(
        [*alembic, "upgrade", "head"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    out = subprocess.run(
        [*alembic, "current"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    (head,) = head_revisions()
    assert out.returncode == 0 and f"{head} (head)" in out.stdout, out.stderr


def test_concurrent_first_starts_on_one_sqlite_file(tmp_path: Path) -> None:
    """Replicas of the embedded default starting together in one var/ all migrate cleanly."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'race.db'}"
    code = (
        "import asyncio, sys, time\n"
        "from tenants.db import make_engine\n"
        "from tenants.migrate import prepare_schema, schema_is_current\n"
        "async def main():\n"
        "    engine = make_engine(sys.argv[1])\n"
        "    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # start together\n"
        "    await prepare_schema(engine)\n"
        "    assert await schema_is_current(engine)\n"
        "    await engine.dispose()\n"
        "asyncio.run(main())\n"
    )
    start = str(time.time() + 3.0)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, url, start], cwd=REPO, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(errors)


async def test_a_rebuilt_tenants_table_keeps_every_row_that_refers_to_it(tmp_path: Path) -> None:
    """SQLite rebuilds ``tenants`` for a new column (copy, DROP, rename): with foreign keys on
    while migrating, the DROP deleted every key, prompt and MCP server through their cascades."""
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'old.db'}")
    try:
        await migrate_engine(engine, "upgrade", "0009_sealed_secrets")
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO tenants (id, name, status, created_at, updated_at, cache_salt,"
                    " allow_client_system) VALUES ('t1', 't1', 'active', CURRENT_TIMESTAMP,"
                    " CURRENT_TIMESTAMP, 'salt', false)"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO mcp_servers (id, tenant_id, url, bearer, tools, created_at)"
                    " VALUES ('mcp_1', 't1', 'https://m.example.com/', NULL, '[]',"
                    " CURRENT_TIMESTAMP)"
                )
            )
        await migrate_engine(engine, "upgrade", "head")
        async with engine.connect() as conn:
            servers = (await conn.execute(text("SELECT id FROM mcp_servers"))).scalars().all()
            checks = (await conn.execute(text("PRAGMA foreign_keys"))).scalar()
    finally:
        await engine.dispose()
    assert servers == ["mcp_1"]
    assert checks == 1  # on again for whatever the pool hands out next
