"""``kvgate serve`` end to end: the embedded default, and two replicas sharing Redis."""

from __future__ import annotations

import asyncio
import stat
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from tests.e2e.servers import ServeProcess
from tests.tenants.fixtures import SECRETS_KEY

ADMIN = "e2e-admin-token-0123456789"


async def admin(http: aiohttp.ClientSession, url: str, token: str, path: str, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    async with http.post(f"{url}/admin/v1{path}", json=body, headers=headers) as resp:
        data = await resp.json()
        assert resp.status == 201, data
        return data


async def admin_get(http: aiohttp.ClientSession, url: str, token: str, path: str) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    async with http.get(f"{url}/admin/v1{path}", headers=headers) as resp:
        data = await resp.json()
        assert resp.status == 200, data
        return data


async def test_embedded_default_serves_chat_and_remembers_its_admin_token(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path, {})
    server.start()
    try:
        await server.wait_ready()
        token = server.admin_token()
        assert token, server.read_output()
        assert (tmp_path / "var" / "kvgate.db").is_file()
        assert (tmp_path / "var" / "demo-model" / "config.json").is_file()
        async with aiohttp.ClientSession() as http:
            body = {"id": "embedded", "name": "Embedded", "system_prompt": "Be helpful."}
            await admin(http, server.url, token, "/tenants", body)
            key = await admin(http, server.url, token, "/tenants/embedded/keys", {"kind": "server"})
            (worker,) = (await admin_get(http, server.url, token, "/cluster"))["workers"]
        # the local worker: calls over its owner-only Unix socket, probes on loopback TCP
        assert worker["url"].startswith("http://127.0.0.1:"), worker
        assert worker["calls"].startswith("unix:"), worker
        socket_path = Path(worker["calls"].removeprefix("unix:"))
        assert stat.S_ISSOCK(socket_path.stat().st_mode)
        assert stat.S_IMODE(socket_path.stat().st_mode) & 0o077 == 0  # owner-only
        async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key["key"], max_retries=0) as c:
            model = (await c.models.list()).data[0].id
            assert model == "demo-model"
            resp = await c.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}]
            )
            assert resp.usage.completion_tokens <= 4  # KVGATE_DEFAULT_MAX_TOKENS
        assert await server.stop() == 0
        out = server.read_output()
        assert key["key"] not in out and "Be helpful." not in out  # logs hold no secrets
    finally:
        if server.proc and server.proc.poll() is None:
            server.proc.kill()

    again = ServeProcess(tmp_path, {})
    again.start()
    try:
        await again.wait_ready()
        assert again.admin_token() is None  # printed once, on the first start only
    finally:
        await again.stop()


@pytest.mark.timeout(180)
async def test_two_replicas_sharing_redis_admit_exactly_the_limit(
    tmp_path: Path, postgres_url: str
) -> None:
    prefix = f"kvgate-e2e-{uuid.uuid4().hex[:8]}:"
    env = {
        "KVGATE_DATABASE_URL": postgres_url,
        "KVGATE_SECRETS_KEY": SECRETS_KEY,  # PostgreSQL: the key is required
        "KVGATE_REDIS_URL": "redis://127.0.0.1:6379/0",
        "KVGATE_REDIS_PREFIX": prefix,
        "KVGATE_TENANT_EVENT_CHANNEL": f"{prefix}events",
        "KVGATE_ADMIN_TOKEN": ADMIN,
        # This test is about exactness, not outages: a loaded CI box must not trip fail-open.
        "KVGATE_REDIS_TIMEOUT_S": "5",
    }
    replicas = [ServeProcess(tmp_path, env) for _ in range(2)]
    for r in replicas:
        r.start()
    try:
        await asyncio.gather(*(r.wait_ready() for r in replicas))
        async with aiohttp.ClientSession() as http:
            body = {"id": "shared", "name": "Shared", "limits": {"rpm": 10}}
            await admin(http, replicas[0].url, ADMIN, "/tenants", body)
            key = (
                await admin(
                    http, replicas[1].url, ADMIN, "/tenants/shared/keys", {"kind": "server"}
                )
            )["key"]

            async def call(i: int) -> int:
                url = f"{replicas[i % 2].url}/v1/chat/completions"
                req = {"model": "demo-model", "messages": [{"role": "user", "content": "x"}]}
                hdrs = {"Authorization": f"Bearer {key}"}
                async with http.post(url, json={**req, "max_tokens": 1}, headers=hdrs) as resp:
                    return resp.status

            statuses = await asyncio.gather(*(call(i) for i in range(24)))
        assert statuses.count(200) == 10, statuses
        assert statuses.count(429) == 14, statuses
    finally:
        for r in replicas:
            await r.stop()
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
