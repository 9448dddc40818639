"""Fixtures of the Responses tests: a gateway database on either backend."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tenants.migrate import upgrade_to_head


@pytest.fixture(params=["sqlite", "postgresql"])
def any_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh gateway database: embedded SQLite (migrated at start-up) or PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
        asyncio.run(upgrade_to_head(url))
        return url
    pg: str = request.getfixturevalue("gateway_database")
    return pg
