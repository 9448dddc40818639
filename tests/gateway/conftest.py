from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.conftest import SHARED_REDIS_URL
from tests.gateway.redis_server import RedisServer


@pytest.fixture
def redis_prefix() -> str:
    return f"kvgate-test-{uuid.uuid4().hex[:12]}:"


@pytest.fixture
async def shared_redis(redis_prefix: str) -> AsyncIterator[aioredis.Redis]:
    """The machine's Redis; every key this test writes is under ``redis_prefix`` and removed."""
    client = aioredis.Redis.from_url(SHARED_REDIS_URL)
    yield client
    keys = [k async for k in client.scan_iter(match=f"{redis_prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.runtime.model.demo import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("demo-model"))


def long_context_copy(demo_model_dir: Path, dest: Path, positions: int) -> Path:
    """A copy of the demo model whose context is ``positions`` tokens: huge prompts pass the
    bounds and are really rendered and tokenized."""
    import json
    import shutil

    path = dest / "model"
    shutil.copytree(demo_model_dir, path)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = positions
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def long_context_model(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model with a 128k-token context (tests/gateway/prompts/test_loop_stall.py)."""
    return long_context_copy(demo_model_dir, tmp_path_factory.mktemp("long-context"), 1 << 17)


@pytest.fixture(scope="session")
def template_database() -> Iterator[str]:
    """A PostgreSQL database migrated to head once; each test gets a copy of it."""
    import asyncio

    from tenants.migrate import upgrade_to_head
    from tests.gateway.harness import create_database, drop_database, pg_url

    name = asyncio.run(create_database())
    asyncio.run(upgrade_to_head(pg_url(name)))
    yield name
    asyncio.run(drop_database(name))


@pytest.fixture
async def gateway_database(template_database: str) -> AsyncIterator[str]:
    """A fresh tenant database for one test (a copy of the migrated template)."""
    from tests.gateway.harness import create_database, drop_database, pg_url

    name = await create_database(template_database)
    yield pg_url(name)
    await drop_database(name)
