"""Price and budget writes leave audit rows naming the admin principal that made them (the
bootstrap admin token, and a tenant's own editor for its budgets), never the webhook URL."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from tests.gateway.harness import ADMIN_TOKEN, LiveGateway, live_gateway, make_settings

ADMIN = "admin"  # the actor of the bootstrap admin token (tests/gateway/admin/test_admin.py)


async def _as(gw: LiveGateway, token: str, method: str, path: str, body: Any = None) -> int:
    url = f"{gw.base_url}/admin/v1{path}"
    async with gw.http.request(
        method, url, json=body, headers={"Authorization": f"Bearer {token}"}
    ) as r:
        await r.read()
        return r.status


async def test_price_and_budget_writes_are_audited(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path, KVGATE_MODEL_NAME="demo")
    async with live_gateway(settings, demo_model_dir) as gw:
        tenant = await gw.create_tenant("audited")
        keys = await gw.admin("GET", f"/tenants/{tenant.id}/keys")
        key_id = keys["data"][0]["id"]
        model = f"m-{uuid.uuid4().hex[:6]}"
        await gw.admin("PUT", f"/prices/{model}", {"input": 1, "output": 2})
        assert await _as(gw, ADMIN_TOKEN, "DELETE", f"/prices/{model}") == 204
        hook = "https://hooks.example.com/budget?token=very-secret"
        await gw.admin(
            "PUT",
            f"/tenants/{tenant.id}/budget",
            {"day": {"max_tokens": 1000}, "soft_webhook": hook},
        )
        editor = await gw.admin("POST", "/admins", {"scope": tenant.id, "access": "editor"})
        path = f"/tenants/{tenant.id}/keys/{key_id}/budget"
        assert await _as(gw, editor["token"], "PUT", path, {"month": {"max_spend_usd": 5}}) == 200
        rows = (await gw.admin("GET", "/audit"))["data"]
        tenant_rows = (await gw.admin("GET", f"/audit?tenant={tenant.id}"))["data"]
    prices = [
        r for r in rows if r["action"].startswith("price.") and r["details"]["model"] == model
    ]
    assert [(r["action"], r["actor"]) for r in reversed(prices)] == [
        ("price.set", ADMIN),
        ("price.delete", ADMIN),
    ]
    assert prices[-1]["details"]["input"] == 1.0  # the set, with its price
    budgets = [r for r in reversed(tenant_rows) if r["action"] == "budget.set"]
    assert [(r["actor"], r["details"]["key_id"]) for r in budgets] == [
        (ADMIN, None),
        (editor["id"], key_id),
    ]
    assert budgets[0]["details"]["day"]["max_tokens"] == 1000
    assert budgets[0]["details"]["soft_webhook"] is True
    assert budgets[1]["details"]["month"]["max_spend_usd"] == 5
    assert "very-secret" not in str(tenant_rows)


async def test_a_spend_ceiling_past_a_prices_bound_is_taken_and_past_its_own_refused(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path, KVGATE_MODEL_NAME="demo")
    async with live_gateway(settings, demo_model_dir) as gw:
        tenant = await gw.create_tenant("big-spender")
        path = f"/tenants/{tenant.id}/budget"
        assert await _as(gw, ADMIN_TOKEN, "PUT", path, {"month": {"max_spend_usd": 10**9}}) == 200
        budget = await gw.admin("GET", path)
        too_big = {"month": {"max_spend_usd": 10**9 + 1}}
        assert await _as(gw, ADMIN_TOKEN, "PUT", path, too_big) == 422
    assert budget["month"]["max_spend_usd"] == 10**9
