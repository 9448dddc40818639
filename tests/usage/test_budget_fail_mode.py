"""Budgets fail closed when their state cannot be known: the gateway's own Redis killed, a chat
of a tenant with a budget is refused with 503 ``budget_unavailable`` (default), or served with
``KVGATE_BUDGET_FAIL_MODE=open``; a tenant without a budget is served either way (rate limits
fail over to this process, gateway/ratelimit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gateway.harness import LiveGateway, live_gateway, make_settings
from tests.gateway.redis_server import RedisServer


async def _chat(gw: LiveGateway, key: str) -> tuple[int, dict[str, Any]]:
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    headers = {"Authorization": f"Bearer {key}"}
    async with gw.http.post(f"{gw.base_url}/v1/chat/completions", json=body, headers=headers) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("mode", ["closed", "open"])
async def test_budget_with_redis_killed(
    mode: str,
    private_redis: RedisServer,
    gateway_database: str,
    demo_model_dir: Path,
    tmp_path: Path,
) -> None:
    env = {
        "KVGATE_MODEL_NAME": "demo",
        "KVGATE_REDIS_URL": private_redis.url,
        "KVGATE_REDIS_TIMEOUT_S": "0.5",
        "KVGATE_REDIS_RETRY_S": "0.1",
    }
    if mode == "open":
        env["KVGATE_BUDGET_FAIL_MODE"] = "open"
    async with live_gateway(make_settings(gateway_database, tmp_path, **env), demo_model_dir) as gw:
        limits = {"rpm": 10_000, "max_concurrency": 8}
        capped = await gw.create_tenant("capped", limits=limits)
        free = await gw.create_tenant("free", limits=limits)
        await gw.admin("PUT", f"/tenants/{capped.id}/budget", {"day": {"max_tokens": 100_000}})
        assert (await _chat(gw, capped.key))[0] == 200  # Redis up: the budget admits
        private_redis.stop()
        status, body = await _chat(gw, capped.key)
        if mode == "closed":
            assert status == 503, body
            assert body["error"]["code"] == "budget_unavailable"
        else:
            assert status == 200, body
        status, body = await _chat(gw, free.key)
        assert status == 200, body
