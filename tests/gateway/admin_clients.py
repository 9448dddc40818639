"""An in-process admin sub-app on the test store, and principal tokens for it."""

from __future__ import annotations

import hashlib
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.admin import ADMIN_PREFIX, create_admin_app
from tenants.store import TenantStore
from tests.tenants.factories import ADMIN_TOKEN

BOOTSTRAP = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TOKEN_SHA = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def admin_client(store: TenantStore, **overrides: Any) -> TestClient:
    kwargs: dict[str, Any] = {"admin_token_sha256": TOKEN_SHA, **overrides}
    root = web.Application()
    root.add_subapp(ADMIN_PREFIX, create_admin_app(store, **kwargs))
    client = TestClient(TestServer(root, host="127.0.0.1"))
    await client.start_server()
    return client


async def call(
    api: TestClient, method: str, path: str, status: int, headers: Any = None, **kw: Any
) -> Any:
    resp = await api.request(method, f"/admin/v1{path}", headers=headers or BOOTSTRAP, **kw)
    body = await resp.json()
    assert resp.status == status, (resp.status, body)
    return body


async def new_admin(api: TestClient, scope: str, access: str, **extra: Any) -> dict[str, Any]:
    body = {"scope": scope, "access": access, **extra}
    created: dict[str, Any] = await call(api, "POST", "/admins", 201, json=body)
    return created
