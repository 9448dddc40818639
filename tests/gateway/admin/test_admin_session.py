"""Console sessions: sign in with a token, cookie attributes, CSRF on writes, idle and absolute
expiry, sign-out, revocation; the console's files and their security headers; start-up refuses
an admin route without an access rule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.admin import ADMIN_PREFIX, MemorySessionStore, create_admin_app
from gateway.admin.console import CSP
from tenants.store import TenantStore
from tests.gateway.admin_clients import TOKEN_SHA, admin_client, call, new_admin
from tests.tenants.factories import ADMIN_TOKEN, make_tenant
from tests.tenants.fixtures import db_url, postgresql_url, sqlite_url, store

__all__ = ["db_url", "postgresql_url", "sqlite_url", "store"]
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def api(store: TenantStore) -> AsyncIterator[TestClient]:
    client = await admin_client(store, sessions=MemorySessionStore(idle_s=600, max_s=3600))
    yield client
    await client.close()


async def sign_in(api: TestClient, token: str = ADMIN_TOKEN) -> dict[str, Any]:
    resp = await api.post("/admin/v1/session", json={"token": token})
    body: dict[str, Any] = await resp.json()
    assert resp.status == 201, body
    return body


async def test_sign_in_sets_a_strict_cookie_and_writes_need_csrf(
    api: TestClient, store: TenantStore
) -> None:
    await make_tenant(store, "acme")
    resp = await api.post("/admin/v1/session", json={"token": ADMIN_TOKEN})
    body = await resp.json()
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/admin" in cookie
    assert "Secure" not in cookie  # loopback; any other host gets Secure
    assert ADMIN_TOKEN not in cookie and resp.headers["Cache-Control"] == "no-store"
    assert body["principal"] == {
        "id": "admin",
        "scope": "platform",
        "access": "editor",
        "expires_at": None,
    }
    csrf = body["csrf_token"]
    await call_cookie(api, "GET", "/tenants", 200)
    me = await call_cookie(api, "GET", "/session", 200)
    assert me["csrf_token"] == csrf
    err = (await call_cookie(api, "PATCH", "/tenants/acme", 403, json={"name": "x"}))["error"]
    assert err["code"] == "csrf_failed"
    wrong = {"X-CSRF-Token": csrf[:-1] + ("A" if csrf[-1] != "A" else "B")}
    await call_cookie(api, "PATCH", "/tenants/acme", 403, json={"name": "x"}, headers=wrong)
    ok = {"X-CSRF-Token": csrf}
    await call_cookie(api, "PATCH", "/tenants/acme", 200, json={"name": "x"}, headers=ok)
    await call_cookie(api, "DELETE", "/session", 200, headers=ok)
    err = (await call_cookie(api, "GET", "/tenants", 401))["error"]
    assert err["code"] in ("session_expired", "invalid_admin_token")


async def call_cookie(api: TestClient, method: str, path: str, status: int, **kw: Any) -> Any:
    resp = await api.request(method, f"/admin/v1{path}", **kw)  # the jar's cookie only
    body = await resp.json()
    assert resp.status == status, (resp.status, body)
    return body


async def test_wrong_token_and_bad_body_do_not_sign_in(api: TestClient) -> None:
    resp = await api.post("/admin/v1/session", json={"token": "not-a-token-at-all"})
    assert resp.status == 401 and "Set-Cookie" not in resp.headers
    resp = await api.post("/admin/v1/session", json={"token": 5})
    assert resp.status == 422
    resp = await api.post("/admin/v1/session", data=b"{", headers=JSON)
    assert resp.status == 400
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # what a cross-site form sends
    resp = await api.post("/admin/v1/session", data=b'{"token": "x"}', headers=form)
    assert resp.status == 400 and "Set-Cookie" not in resp.headers
    elsewhere = {"Origin": "https://evil.example"}
    resp = await api.post("/admin/v1/session", json={"token": ADMIN_TOKEN}, headers=elsewhere)
    assert resp.status == 403 and "Set-Cookie" not in resp.headers
    assert (await resp.json())["error"]["code"] == "cross_origin"


async def test_a_viewer_session_reads_and_signs_out_but_never_writes(
    api: TestClient, store: TenantStore
) -> None:
    await make_tenant(store, "acme")
    viewer = await new_admin(api, "acme", "viewer")
    body = await sign_in(api, viewer["token"])
    ok = {"X-CSRF-Token": body["csrf_token"]}
    assert body["principal"]["scope"] == "acme" and body["principal"]["access"] == "viewer"
    await call_cookie(api, "GET", "/tenants/acme", 200)
    err = (
        await call_cookie(
            api, "PUT", "/tenants/acme/system-prompt", 403, headers=ok, json={"text": "x"}
        )
    )["error"]
    assert err["code"] == "read_only"
    await call_cookie(api, "DELETE", "/session", 200, headers=ok)


async def test_revoking_the_token_ends_its_sessions(api: TestClient, store: TenantStore) -> None:
    admin = await new_admin(api, "platform", "viewer")
    await sign_in(api, admin["token"])
    await call_cookie(api, "GET", "/tenants", 200)
    await call(api, "DELETE", f"/admins/{admin['id']}", 200)
    err = (await call_cookie(api, "GET", "/tenants", 401))["error"]
    assert err["code"] == "session_expired"


@pytest.mark.parametrize(("idle_s", "max_s"), [(0.3, 60.0), (60.0, 0.6)])
async def test_sessions_expire_idle_and_absolute(
    store: TenantStore, idle_s: float, max_s: float
) -> None:
    api = await admin_client(store, sessions=MemorySessionStore(idle_s=idle_s, max_s=max_s))
    try:
        await sign_in(api)
        for _ in range(3):  # activity keeps an idle timer alive, never the absolute one
            await call_cookie(api, "GET", "/tenants", 200)
            await asyncio.sleep(min(idle_s, max_s) / 3)
        await asyncio.sleep(min(idle_s, max_s))
        err = (await call_cookie(api, "GET", "/tenants", 401))["error"]
        assert err["code"] == "session_expired"
    finally:
        await api.close()


async def test_console_files_carry_a_strict_policy(api: TestClient) -> None:
    resp = await api.get("/admin/ui/")
    assert resp.status == 200 and resp.content_type == "text/html"
    assert resp.headers["Content-Security-Policy"] == CSP
    assert "frame-ancestors 'none'" in CSP and "unsafe-inline" not in CSP
    assert resp.headers["X-Frame-Options"] == "DENY"
    page = await resp.text()
    assert "<script>" not in page and "style=" not in page and "http" not in page.lower()
    js = await api.get("/admin/ui/js/app.js")
    assert js.status == 200 and js.content_type == "text/javascript"
    assert (await api.get("/admin/ui/nope.js")).status == 404
    for bad in ("/admin/ui/../app.py", "/admin/ui/%2e%2e/app.py", "/admin/ui/js/../../app.py"):
        resp = await api.get(bad)  # never a file outside the console's (404, or 401 unmatched)
        assert resp.status in (401, 404) and "import" not in await resp.text()


async def test_a_route_without_an_access_rule_fails_start_up(store: TenantStore) -> None:
    admin = create_admin_app(store, admin_token_sha256=TOKEN_SHA)

    async def sneaky(request: web.Request) -> web.Response:
        return web.json_response({})

    admin.router.add_get("/v1/sneaky", sneaky)
    root = web.Application()
    root.add_subapp(ADMIN_PREFIX, admin)
    server = TestServer(root, host="127.0.0.1")
    with pytest.raises(RuntimeError, match="GET /v1/sneaky: no access declaration"):
        await server.start_server()
    await server.close()
