from __future__ import annotations

from collections.abc import AsyncIterator

import pytest


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh PostgreSQL database migrated to head, dropped after the test."""
    from tenants.migrate import upgrade_to_head
    from tests.gateway.harness import create_database, drop_database, pg_url

    name = await create_database()
    await upgrade_to_head(pg_url(name))
    yield pg_url(name)
    await drop_database(name)
