"""Replicas starting together migrate one fresh PostgreSQL database without racing."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from tenants.db import make_engine
from tenants.migrate import head_revisions, upgrade_to_head
from tests.tenants.fixtures import PG_URL_TEMPLATE, create_pg_database, drop_pg_database

REPO = Path(__file__).resolve().parents[2]
PROCESSES = 4

# Each process waits for a common start time, then migrates (upgrade to head) and reports.
MIGRATE = (
    "import asyncio, sys, time\n"
    "from tenants.migrate import upgrade_to_head\n"
    "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
    "asyncio.run(upgrade_to_head(sys.argv[1]))\n"
)


@pytest.fixture
def fresh_pg_url() -> Iterator[str]:
    name = create_pg_database()
    try:
        yield PG_URL_TEMPLATE.format(name=name)
    finally:
        drop_pg_database(name)


def test_replicas_migrating_a_fresh_database_at_once(fresh_pg_url: str) -> None:
    start = str(time.time() + 4.0)  # imports take a while on a loaded machine
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATE, fresh_pg_url, start],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * PROCESSES, "\n".join(errors)

    async def versions() -> list[str]:
        engine = make_engine(fresh_pg_url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(text("SELECT version_num FROM alembic_version"))
                return [r[0] for r in rows]
        finally:
            await engine.dispose()

    import asyncio

    assert sorted(asyncio.run(versions())) == sorted(head_revisions())


async def test_migration_waits_for_the_advisory_lock(fresh_pg_url: str) -> None:
    """While another session holds the lock, a migration does not start; it runs once the
    lock is released."""
    import asyncio

    from tenants.migrate import PG_MIGRATION_LOCK

    holder = make_engine(fresh_pg_url)
    try:
        async with holder.connect() as conn:
            await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": PG_MIGRATION_LOCK})
            migrating = asyncio.create_task(upgrade_to_head(fresh_pg_url))
            await asyncio.sleep(1.0)
            assert not migrating.done()
            tables = await conn.execute(text("SELECT to_regclass('alembic_version')"))
            assert tables.scalar() is None  # nothing created while the lock is held
            await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PG_MIGRATION_LOCK})
            await conn.commit()
            await asyncio.wait_for(migrating, 60)
    finally:
        await holder.dispose()
