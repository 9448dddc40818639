"""Fixtures of the ledger tests: a fresh migrated database per test on either backend (a copy of
the migrated PostgreSQL template, or a new SQLite file migrated with ``alembic upgrade head``),
the demo model, Redis prefixes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenants.migrate import upgrade_to_head
from tests.gateway.conftest import (
    demo_model_dir,
    gateway_database,
    private_redis,
    redis_prefix,
    shared_redis,
    template_database,
)
from tests.gateway.harness import create_database, drop_database, pg_url

__all__ = [
    "demo_model_dir",
    "gateway_database",
    "private_redis",
    "redis_prefix",
    "shared_redis",
    "template_database",
]


@pytest.fixture(params=["postgresql", "sqlite"])
def ledger_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database on each backend."""
    if request.param == "postgresql":
        template = request.getfixturevalue("template_database")
        name = asyncio.run(create_database(template))
        yield pg_url(name)
        asyncio.run(drop_database(name))
        return
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    asyncio.run(upgrade_to_head(url))
    yield url
