"""Fixtures of the console tests: one gateway and one Chromium per module.

Screenshots of the main pages go to $KVGATE_CONSOLE_SCREENSHOTS when set (docs/images/ is made
with it), else to the test's temporary directory.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.console.console import Env
from tests.gateway.conftest import (  # noqa: F401  (shared fixtures)
    demo_model_dir,
    gateway_database,
    template_database,
)
from tests.gateway.harness import (
    create_database,
    drop_database,
    live_gateway,
    make_settings,
    pg_url,
)
from tests.widget.browser import chromium, require_chromium


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(
    template_database: str,  # noqa: F811  (the fixture imported above)
    demo_model_dir: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Env]:
    require_chromium()
    name = await create_database(template_database)
    shots = Path(os.environ.get("KVGATE_CONSOLE_SCREENSHOTS") or tmp_path_factory.mktemp("shots"))
    shots.mkdir(parents=True, exist_ok=True)
    try:
        settings = make_settings(pg_url(name), tmp_path_factory.mktemp("console"))
        async with live_gateway(settings, demo_model_dir) as gw, chromium() as browser:
            yield Env(gw, browser, shots)
    finally:
        await drop_database(name)
