"""Database fixtures shared by tests/tenants and tests/gateway/admin/test_admin*.py.

One database per backend per test session, built with ``alembic upgrade head`` (so migrations are
exercised): a SQLite file under pytest's tmp dir, and a fresh ``kvgate_test_<random>`` database
on the local PostgreSQL server (dropped at the end; skipped when the server is not reachable,
failed instead with CI=true).
``store`` empties every table before each test, so tests see only their own rows.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from sqlalchemy import text

from tenants.migrate import upgrade_to_head
from tenants.models import ALL_TABLES
from tenants.secret_keys import SecretsSettings
from tenants.store import TenantStore
from tests.conftest import service_unavailable

# The secrets key of test stores and gateways (KVGATE_SECRETS_KEY; tenants/sealing.py).
SECRETS_KEY = "test-secrets-key-0123456789abcdef0123456789"
TEST_SECRETS = SecretsSettings(keys=(SECRETS_KEY,))
PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_URL_TEMPLATE = "postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
BACKENDS = ("sqlite", "postgresql")


async def _pg_admin(sql: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def create_pg_database() -> str:
    """Create an empty database; returns its name. Skips the test when PostgreSQL is down."""
    name = f"kvgate_test_{secrets.token_hex(6)}"
    try:
        asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"'))
    except (OSError, asyncpg.PostgresError) as exc:
        service_unavailable("PostgreSQL at 127.0.0.1:5432", exc)
    return name


def drop_pg_database(name: str) -> None:
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('db') / 'kvgate.db'}"
    asyncio.run(upgrade_to_head(url))
    return url


@pytest.fixture(scope="session")
def postgresql_url() -> Iterator[str]:
    name = create_pg_database()
    url = PG_URL_TEMPLATE.format(name=name)
    try:
        asyncio.run(upgrade_to_head(url))
        yield url
    finally:
        drop_pg_database(name)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest) -> str:
    """A migrated database URL; every test using it runs once per backend."""
    return request.getfixturevalue(f"{request.param}_url")


async def clear_tables(store: TenantStore) -> None:
    async with store.sessions() as session, session.begin():
        for table in ALL_TABLES:  # children first
            await session.execute(text(f"DELETE FROM {table}"))


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[TenantStore]:
    s = TenantStore.open(db_url, secrets=TEST_SECRETS)
    await clear_tables(s)
    yield s
    await s.aclose()
