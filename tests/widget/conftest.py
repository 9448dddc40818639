"""Fixtures of the widget tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.gateway.conftest import (  # noqa: F401  (shared fixtures)
    demo_model_dir,
    gateway_database,
    template_database,
)
from tests.gateway.harness import LiveGateway, gateway_on_fresh_database


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    template_database: str,  # noqa: F811  (the fixture imported above)
    demo_model_dir: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LiveGateway]:
    """One gateway per test module, on its own database (each test uses its own tenants)."""
    var = tmp_path_factory.mktemp("widget")
    async with gateway_on_fresh_database(template_database, demo_model_dir, var) as live:
        yield live
