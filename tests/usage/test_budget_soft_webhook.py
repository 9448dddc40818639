"""A budget's soft threshold crossed calls the tenant's webhook once, signed with the tenant's
tool secret as tool webhooks are (verified here by a real receiver on loopback), and counts the
crossing in the metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from gateway.chat.tools.run.webhook import verify
from tests.gateway.harness import LiveGateway, live_gateway, make_settings, wait_for

MAX_TOKENS = 4


async def _chat(gw: LiveGateway, key: str) -> dict[str, Any]:
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    body["max_tokens"] = MAX_TOKENS
    headers = {"Authorization": f"Bearer {key}"}
    async with gw.http.post(f"{gw.base_url}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        out: dict[str, Any] = await r.json()
        return out


async def test_soft_threshold_calls_the_signed_webhook(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    got: list[tuple[bytes, CIMultiDict[str]]] = []

    async def receive(request: web.Request) -> web.Response:
        got.append((await request.read(), CIMultiDict(request.headers)))
        return web.json_response({"ok": True})

    receiver = web.Application()
    receiver.router.add_post("/budget-hook", receive)
    server = TestServer(receiver, host="127.0.0.1")
    await server.start_server()
    try:
        settings = make_settings(
            gateway_database,
            tmp_path,
            KVGATE_MODEL_NAME="demo",
            KVGATE_TOOL_ALLOWED_HOSTS=f"127.0.0.1:{server.port}",
        )
        async with live_gateway(settings, demo_model_dir) as gw:
            tenant = await gw.create_tenant("soft", limits={"rpm": 10_000, "max_concurrency": 8})
            secret = (await gw.admin("POST", f"/tenants/{tenant.id}/tool-secret/rotate"))[
                "webhook_secret"
            ]
            first = await _chat(gw, tenant.key)  # before any budget: its size, nothing sent
            reserve = first["usage"]["prompt_tokens"] + MAX_TOKENS
            url = f"http://127.0.0.1:{server.port}/budget-hook"
            budget = {"day": {"max_tokens": 20 * reserve}, "soft_threshold": 0.5}
            out = await gw.admin(
                "PUT", f"/tenants/{tenant.id}/budget", {**budget, "soft_webhook": url}
            )
            assert out["soft_webhook"] == url
            for _ in range(16):  # 0.5 of the budget is crossed within 10 reservations
                await _chat(gw, tenant.key)
            await wait_for(lambda: bool(got), timeout=10.0)
            async with gw.http.get(gw.metrics_url) as r:
                metrics = await r.text()
    finally:
        await server.close()
    assert len(got) == 1, got  # once per crossing, not per request after it
    raw, headers = got[0]
    assert verify(secret, raw, headers)
    assert not verify("0" * 64, raw, headers)  # another secret does not verify
    event = json.loads(raw)
    assert headers["X-Kvgate-Event"] == event["event"] == "budget.soft_threshold"
    assert headers["X-Kvgate-Tenant"] == event["tenant_id"] == tenant.id
    assert event["period"] == "day" and event["what"] == "tokens"
    assert event["limit"] == 20 * reserve
    assert event["used"] >= 10 * reserve
    labels = f'period="day",scope="tenant",tenant="{tenant.id}"'
    assert f"kvgate_budget_soft_threshold_total{{{labels}}} 1.0" in metrics
    assert 'kvgate_budget_webhook_calls_total{result="ok"} 1.0' in metrics
