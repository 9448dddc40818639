"""Admin principals through the API: created once with their token, used, listed, revoked,
expired; the audit log names who wrote; the bootstrap token stays a platform editor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from tenants.events import RedisEventBridge
from tenants.store import TenantStore
from tests.conftest import SHARED_REDIS_URL
from tests.gateway.admin_clients import admin_client, bearer, call, new_admin
from tests.tenants.factories import dump_tables, make_tenant
from tests.tenants.fixtures import db_url, postgresql_url, sqlite_url, store

__all__ = ["db_url", "postgresql_url", "sqlite_url", "store"]


@pytest.fixture
async def api(store: TenantStore) -> AsyncIterator[TestClient]:
    client = await admin_client(store, principal_ttl_s=300.0)  # only events refresh it
    yield client
    await client.close()


async def test_create_shows_token_once_and_stores_only_its_hash(
    api: TestClient, store: TenantStore
) -> None:
    await make_tenant(store, "acme")
    created = await new_admin(api, "acme", "editor", name="Ops <b>team</b>")
    token = created["token"]
    assert token.startswith("kva_") and len(token) > 40
    assert created["scope"] == "acme" and created["status"] == "active"
    assert created["name"] == "Ops <b>team</b>" and created["created_by"] == "admin"
    listed = await call(api, "GET", "/admins", 200)
    assert [a["id"] for a in listed["data"]] == [created["id"]]
    assert "token" not in listed["data"][0]
    one = await call(api, "GET", f"/admins/{created['id']}", 200)
    assert "token" not in one and one["access"] == "editor"
    assert token not in await dump_tables(store)
    assert (await call(api, "GET", "/admins?scope=platform", 200))["data"] == []
    await call(api, "GET", "/admins/adm_nope", 404)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"scope": "platform", "access": "owner"}, "access"),
        ({"scope": "Not A Tenant", "access": "viewer"}, "scope"),
        ({"scope": "ghost", "access": "viewer"}, "scope"),  # no such tenant
        (
            {"scope": "platform", "access": "viewer", "expires_at": "2001-01-01T00:00:00Z"},
            "expires_at",
        ),
        ({"scope": "platform", "access": "viewer", "expires_at": "soon"}, "expires_at"),
        ({"scope": "platform", "access": "viewer", "role": "x"}, "role"),
        ({"access": "viewer"}, "scope"),
    ],
)
async def test_create_refuses_bad_fields(
    api: TestClient, body: dict[str, object], param: str
) -> None:
    err = (await call(api, "POST", "/admins", 422, json=body))["error"]
    assert err["param"] == param


async def test_principal_tokens_work_and_revocation_is_immediate(
    api: TestClient, store: TenantStore
) -> None:
    await make_tenant(store, "acme")
    editor = await new_admin(api, "platform", "editor")
    auth = bearer(editor["token"])
    await call(api, "GET", "/tenants", 200, headers=auth)
    with capture_logs() as logs:
        await call(api, "PATCH", "/tenants/acme", 200, headers=auth, json={"name": "Acme 2"})
        await call(api, "PATCH", "/tenants/ghost", 404, headers=auth, json={"name": "x"})
    writes = [e for e in logs if e["event"] == "admin_write"]
    assert [(e["principal"], e["method"], e["outcome"]) for e in writes] == [
        (editor["id"], "PATCH", 200),
        (editor["id"], "PATCH", "TenantNotFound"),
    ]
    revoked = await call(api, "DELETE", f"/admins/{editor['id']}", 200)
    assert revoked["status"] == "revoked" and revoked["revoked_at"]
    err = (await call(api, "GET", "/tenants", 401, headers=auth))["error"]
    assert err["code"] == "invalid_admin_token"
    again = await call(api, "DELETE", f"/admins/{editor['id']}", 200)  # idempotent
    assert again["revoked_at"] == revoked["revoked_at"]
    audit = (await call(api, "GET", "/audit", 200))["data"]
    actions = [(a["actor"], a["action"]) for a in reversed(audit)]
    assert (editor["id"], "tenant.update") in actions
    assert ("admin", "admin.create") in actions and ("admin", "admin.revoke") in actions
    assert sum(1 for a in actions if a[1] == "admin.revoke") == 1


async def test_expired_token_is_refused(api: TestClient) -> None:
    soon = datetime.now(UTC) + timedelta(seconds=1)
    viewer = await new_admin(api, "platform", "viewer", expires_at=soon.isoformat())
    await call(api, "GET", "/tenants", 200, headers=bearer(viewer["token"]))
    await asyncio.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()) + 0.05)
    await call(api, "GET", "/tenants", 401, headers=bearer(viewer["token"]))
    got = await call(api, "GET", f"/admins/{viewer['id']}", 200)
    assert got["status"] == "expired"


async def test_tenant_admin_audit_and_scope(api: TestClient, store: TenantStore) -> None:
    await make_tenant(store, "acme")
    await make_tenant(store, "other")
    admin = await new_admin(api, "acme", "editor")
    auth = bearer(admin["token"])
    await call(api, "PUT", "/tenants/acme/system-prompt", 200, headers=auth, json={"text": "Hi"})
    rows = (await call(api, "GET", "/tenants/acme/audit", 200, headers=auth))["data"]
    assert rows[0]["actor"] == admin["id"] and rows[0]["action"] == "prompt.set"
    assert {r["tenant_id"] for r in rows} == {"acme"}
    err = (await call(api, "GET", "/tenants/other/audit", 404, headers=auth))["error"]
    assert err["code"] == "tenant_not_found"
    # exactly the answer of a tenant that does not exist: nothing tells the two apart
    missing = (await call(api, "GET", "/tenants/ghost/audit", 404))["error"]
    assert {**missing, "message": missing["message"].replace("ghost", "other")} == err
    await call(api, "GET", "/audit", 403, headers=auth)
    await call(
        api, "POST", "/admins", 403, headers=auth, json={"scope": "acme", "access": "viewer"}
    )


async def test_revoking_one_tenant_admin_leaves_the_others(
    api: TestClient, store: TenantStore
) -> None:
    """A revoked tenant admin's token is refused; the other admins keep working."""
    await make_tenant(store, "acme")
    one = await new_admin(api, "acme", "viewer")
    two = await new_admin(api, "acme", "viewer")
    await call(api, "GET", "/tenants/acme", 200, headers=bearer(one["token"]))
    await call(api, "GET", "/tenants/acme", 200, headers=bearer(two["token"]))
    await call(api, "DELETE", f"/admins/{one['id']}", 200)
    await call(api, "GET", "/tenants/acme", 401, headers=bearer(one["token"]))
    await call(api, "GET", "/tenants/acme", 200, headers=bearer(two["token"]))


async def test_revocation_reaches_another_replica_through_the_event_bus(
    db_url: str, store: TenantStore, redis_prefix: str, shared_redis: object
) -> None:
    """Two gateways on one database, bridged by Redis: a token revoked on one is refused by
    the other at once, although its cache would keep the principal for 300 s."""
    await make_tenant(store, "acme")
    other = TenantStore.open(db_url)
    channel = f"{redis_prefix}events"
    bridges = [RedisEventBridge.from_url(s.bus, SHARED_REDIS_URL, channel) for s in (store, other)]
    one = await admin_client(store, principal_ttl_s=300.0)
    two = await admin_client(other, principal_ttl_s=300.0)
    try:
        for bridge in bridges:
            await bridge.start()
        admin = await new_admin(one, "acme", "viewer")
        auth = bearer(admin["token"])
        await call(two, "GET", "/tenants/acme", 200, headers=auth)  # now cached on two
        await call(one, "DELETE", f"/admins/{admin['id']}", 200)
        await wait_for_status(two, "/tenants/acme", auth, 401)
    finally:
        for closing in (one.close(), two.close(), *(b.aclose() for b in bridges)):
            await closing
        await other.aclose()


async def wait_for_status(
    api: TestClient, path: str, headers: dict[str, str], status: int, timeout: float = 5.0
) -> None:
    async with asyncio.timeout(timeout):
        while True:
            resp = await api.get(f"/admin/v1{path}", headers=headers)
            if resp.status == status:
                return
            await asyncio.sleep(0.02)


async def test_a_deleted_tenants_admins_are_refused_until_it_is_restored(
    api: TestClient, store: TenantStore
) -> None:
    await make_tenant(store, "acme")
    admin = await new_admin(api, "acme", "editor")
    auth = bearer(admin["token"])
    await call(api, "GET", "/tenants/acme", 200, headers=auth)  # cached for 300 s
    await call(api, "DELETE", "/tenants/acme", 200)
    await call(api, "GET", "/tenants/acme", 401, headers=auth)
    await call(api, "PATCH", "/tenants/acme", 200, json={"status": "active"})
    await call(api, "GET", "/tenants/acme", 200, headers=auth)
