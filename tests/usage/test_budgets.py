"""Budgets across two gateway instances sharing Redis and the database: admitted tokens stay
within the budget plus one request's reservation; refusals are 429 ``budget_exceeded`` with
Retry-After and ``x-budget-reset``; after the counters are lost (as in a Redis restart) they are
seeded from the ledger's rollups, so the spent budget stays spent."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from gateway.usage.ledger import LEDGER
from tests.conftest import SHARED_REDIS_URL
from tests.gateway.harness import LiveGateway, live_gateway, make_settings
from tests.usage.helpers import wait_records

BUDGET = 400
MAX_TOKENS = 8


async def _chat(gw: LiveGateway, key: str) -> tuple[int, dict[str, Any], Any]:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": MAX_TOKENS,
    }
    headers = {"Authorization": f"Bearer {key}"}
    async with gw.http.post(f"{gw.base_url}/v1/chat/completions", json=body, headers=headers) as r:
        return r.status, await r.json(), r.headers


async def test_budget_across_two_replicas(
    gateway_database: str,
    demo_model_dir: Path,
    tmp_path: Path,
    redis_prefix: str,
    shared_redis: aioredis.Redis,
) -> None:
    env = {
        "KVGATE_MODEL_NAME": "demo",
        "KVGATE_REDIS_URL": SHARED_REDIS_URL,
        "KVGATE_REDIS_PREFIX": redis_prefix,
        "KVGATE_USAGE_FLUSH_S": "0.05",
    }
    a_settings = make_settings(gateway_database, tmp_path / "a", **env)
    b_settings = make_settings(gateway_database, tmp_path / "b", **env)
    async with (
        live_gateway(a_settings, demo_model_dir) as a,
        live_gateway(b_settings, demo_model_dir) as b,
    ):
        tenant = await a.create_tenant("budget", limits={"rpm": 100000, "max_concurrency": 64})
        out = await a.admin("PUT", f"/tenants/{tenant.id}/budget", {"day": {"max_tokens": BUDGET}})
        assert out["day"]["max_tokens"] == BUDGET
        await b.app[LEDGER].budgets.reload()  # the other replica's periodic reload, now
        first = await _chat(a, tenant.key)
        assert first[0] == 200, first
        reservation = first[1]["usage"]["prompt_tokens"] + MAX_TOKENS
        results = await asyncio.gather(*(_chat(gw, tenant.key) for _ in range(30) for gw in (a, b)))
        results.append(first)
        admitted = sum(r[1]["usage"]["total_tokens"] for r in results if r[0] == 200)
        refused = [r for r in results if r[0] == 429]
        assert refused, "the budget never refused"
        assert admitted <= BUDGET + reservation, (admitted, reservation)
        assert admitted >= BUDGET - reservation  # it admitted up to the budget, not far below
        _, err, headers = refused[0]
        assert err["error"]["code"] == "budget_exceeded"
        assert int(headers["Retry-After"]) >= 1
        reset = datetime.fromisoformat(headers["x-budget-reset"])
        assert reset > datetime.now(UTC) and reset.hour == 0 and reset.minute == 0

        # Counters lost (a Redis restart): seeded from the rollups once the records landed.
        ok = sum(1 for r in results if r[0] == 200)
        await wait_records(gateway_database, tenant.id, len(results))
        keys = [k async for k in shared_redis.scan_iter(match=f"{redis_prefix}bg:*")]
        assert keys
        await shared_redis.delete(*keys)
        again = await _chat(b, tenant.key)
        assert again[0] == 429 and again[1]["error"]["code"] == "budget_exceeded", again
        assert ok >= 1

        # A bigger budget admits again at once in the replica that set it.
        await a.admin("PUT", f"/tenants/{tenant.id}/budget", {"day": {"max_tokens": 10**6}})
        assert (await _chat(a, tenant.key))[0] == 200
