"""Admin API: every route's success and error paths, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.admin import ADMIN_PREFIX, PromptLimit, create_admin_app
from tenants.runtime import ToolPolicy
from tenants.store import TenantStore
from tests.tenants.factories import ADMIN_TOKEN, dump_tables
from tests.tenants.fixtures import db_url, postgresql_url, sqlite_url, store

__all__ = ["db_url", "postgresql_url", "sqlite_url", "store"]

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TOKEN_SHA = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
MAX_PROMPT_TOKENS = 20


def count_words(text: str, tools: ToolPolicy) -> int:
    """A stand-in for the tokenizer: a word a token, and one per tool."""
    return len(text.split()) + len(tools.tools)


def fake_cache(tenant_id: str) -> dict[str, Any]:
    return {"pinned": True, "pinned_blocks": 3, "pinned_tokens": 48, "hit_tokens": 7}


async def _client(store: TenantStore, **overrides: Any) -> TestClient:
    kwargs: dict[str, Any] = {
        "admin_token_sha256": TOKEN_SHA,
        "prompt_limit": PromptLimit(count_words, lambda: MAX_PROMPT_TOKENS),
        "cache_provider": fake_cache,
        **overrides,
    }
    root = web.Application()
    root.add_subapp(ADMIN_PREFIX, create_admin_app(store, **kwargs))
    client = TestClient(TestServer(root, host="127.0.0.1"))
    await client.start_server()
    return client


@pytest.fixture
async def api(store: TenantStore) -> AsyncIterator[TestClient]:
    client = await _client(store)
    yield client
    await client.close()


async def call(api: TestClient, method: str, path: str, status: int, **kw: Any) -> Any:
    kw.setdefault("headers", AUTH)
    resp = await api.request(method, f"/admin/v1{path}", **kw)
    body = await resp.json()
    assert resp.status == status, body
    return body


def error(body: Any) -> dict[str, Any]:
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


async def test_auth(api: TestClient, store: TenantStore) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": ADMIN_TOKEN}):
        resp = await api.get("/admin/v1/tenants", headers=headers)
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert error(await resp.json())["type"] == "authentication_error"
    disabled = await _client(store, admin_token_sha256=None)
    try:
        resp = await disabled.get("/admin/v1/tenants", headers=AUTH)
        assert resp.status == 401
    finally:
        await disabled.close()


async def test_create_get_and_duplicate(api: TestClient) -> None:
    body = {"id": "acme", "name": "Acme", "system_prompt": "Be nice.", "limits": {"rpm": 5}}
    created = await call(api, "POST", "/tenants", 201, json=body)
    assert created["prompt_version"] == 1 and created["limits"]["rpm"] == 5
    assert created["status"] == "active" and "cache_salt" not in created
    got = await call(api, "GET", "/tenants/acme", 200)
    assert got["name"] == "Acme" and got["keys"] == []
    err = error(await call(api, "POST", "/tenants", 409, json=body))
    assert err["code"] == "tenant_exists" and err["param"] == "id"
    err = error(await call(api, "GET", "/tenants/nope", 404))
    assert err["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"id": "A", "name": "x"}, "id"),
        ({"id": "-ab", "name": "x"}, "id"),
        ({"id": "ok-id", "name": ""}, "name"),
        ({"id": "ok-id"}, "name"),
        ({"id": "ok-id", "name": "x", "color": "red"}, "color"),
        ({"id": "ok-id", "name": "x", "limits": {"rpm": 0}}, "limits.rpm"),
        ({"id": "ok-id", "name": "x", "limits": {"burst": 1}}, "limits.burst"),
    ],
)
async def test_create_invalid_fields(api: TestClient, body: dict[str, Any], param: str) -> None:
    err = error(await call(api, "POST", "/tenants", 422, json=body))
    assert err["param"] == param
    assert (await call(api, "GET", "/tenants?status=all", 200))["data"] == []


async def test_bad_json_and_too_long_prompt(api: TestClient) -> None:
    resp = await api.post("/admin/v1/tenants", data=b"{nope", headers=AUTH)
    assert resp.status == 400
    long_prompt = " ".join(["word"] * (MAX_PROMPT_TOKENS + 1))
    err = error(
        await call(
            api,
            "POST",
            "/tenants",
            422,
            json={"id": "ab", "name": "x", "system_prompt": long_prompt},
        )
    )
    assert err["param"] == "system_prompt" and err["code"] == "prompt_too_long"
    assert str(MAX_PROMPT_TOKENS) in err["message"]
    await call(api, "POST", "/tenants", 201, json={"id": "ab", "name": "x"})
    err = error(
        await call(api, "PUT", "/tenants/ab/system-prompt", 422, json={"text": long_prompt})
    )
    assert err["param"] == "text" and str(MAX_PROMPT_TOKENS) in err["message"]
    assert (await call(api, "GET", "/tenants/ab/system-prompts", 200))["data"] == []


async def test_list_paginated(api: TestClient) -> None:
    for i in range(5):
        await call(api, "POST", "/tenants", 201, json={"id": f"t{i}", "name": f"T{i}"})
    await call(api, "DELETE", "/tenants/t2", 200)
    ids, cursor = [], None
    while True:
        page = await call(
            api, "GET", "/tenants?limit=2" + (f"&cursor={cursor}" if cursor else ""), 200
        )
        assert len(page["data"]) <= 2
        ids += [t["id"] for t in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert ids == ["t0", "t1", "t3", "t4"]
    page = await call(api, "GET", "/tenants?status=deleted", 200)
    assert [t["id"] for t in page["data"]] == ["t2"]
    for query, param in (("limit=0", "limit"), ("limit=x", "limit"), ("status=gone", "status")):
        assert error(await call(api, "GET", f"/tenants?{query}", 422))["param"] == param


async def test_patch_and_delete(api: TestClient, store: TenantStore) -> None:
    await call(api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme"})
    key = (await call(api, "POST", "/tenants/acme/keys", 201, json={"kind": "server"}))["key"]
    out = await call(
        api, "PATCH", "/tenants/acme", 200, json={"name": "ACME", "allow_client_system": False}
    )
    assert (out["name"], out["allow_client_system"]) == ("ACME", False)
    assert (
        error(await call(api, "PATCH", "/tenants/acme", 422, json={"status": "deleted"}))["param"]
        == "status"
    )
    assert (
        error(await call(api, "PATCH", "/tenants/acme", 422, json={"cache_salt": "x"}))["param"]
        == "cache_salt"
    )
    await call(api, "PATCH", "/tenants/nope", 404, json={"name": "x"})
    out = await call(api, "DELETE", "/tenants/acme", 200)
    assert out["status"] == "deleted"
    assert await store.authenticate_key(key) is None
    await call(api, "DELETE", "/tenants/acme", 200)  # idempotent
    await call(api, "DELETE", "/tenants/nope", 404)
    err = error(await call(api, "PUT", "/tenants/acme/system-prompt", 409, json={"text": "x"}))
    assert err["code"] == "tenant_deleted"
    await call(api, "PUT", "/tenants/acme/limits", 409, json={})
    await call(api, "POST", "/tenants/acme/keys", 409, json={"kind": "server"})
    out = await call(api, "PATCH", "/tenants/acme", 200, json={"status": "active"})  # restore
    assert out["status"] == "active" and await store.authenticate_key(key) is not None


async def test_patch_the_vllm_visitor_salt(api: TestClient, store: TenantStore) -> None:
    out = await call(api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme"})
    assert out["vllm_visitor_salt"] is False  # off by default: the tenant's salt for all
    out = await call(api, "PATCH", "/tenants/acme", 200, json={"vllm_visitor_salt": True})
    assert out["vllm_visitor_salt"] is True
    assert (await call(api, "GET", "/tenants/acme", 200))["vllm_visitor_salt"] is True
    rt = await store.get_tenant_runtime("acme")
    assert rt is not None and rt.vllm_visitor_salt is True  # what the chat path reads
    bad = await call(api, "PATCH", "/tenants/acme", 422, json={"vllm_visitor_salt": "maybe"})
    assert error(bad)["param"] == "vllm_visitor_salt"
    out = await call(api, "PATCH", "/tenants/acme", 200, json={"vllm_visitor_salt": False})
    assert out["vllm_visitor_salt"] is False
    rt = await store.get_tenant_runtime("acme")
    assert rt is not None and rt.vllm_visitor_salt is False


async def test_system_prompts(api: TestClient, store: TenantStore) -> None:
    await call(
        api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme", "system_prompt": "one"}
    )
    assert await call(api, "PUT", "/tenants/acme/system-prompt", 200, json={"text": "two"}) == {
        "version": 2
    }
    history = (await call(api, "GET", "/tenants/acme/system-prompts", 200))["data"]
    assert [(p["version"], p["text"], p["active"]) for p in history] == [
        (2, "two", True),
        (1, "one", False),
    ]
    rt = await store.get_tenant_runtime("acme")
    assert rt is not None and (rt.prompt_version, rt.prompt_text) == (2, "two")
    assert (
        error(await call(api, "PUT", "/tenants/acme/system-prompt", 422, json={}))["param"]
        == "text"
    )
    await call(api, "PUT", "/tenants/acme/system-prompt", 422, json={"text": "x", "version": 9})
    await call(api, "PUT", "/tenants/nope/system-prompt", 404, json={"text": "x"})
    await call(api, "GET", "/tenants/nope/system-prompts", 404)


async def test_keys(api: TestClient, store: TenantStore) -> None:
    await call(api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme"})
    body = {"kind": "widget", "allowed_origins": ["https://shop.example"]}
    created = await call(api, "POST", "/tenants/acme/keys", 201, json=body)
    assert set(created) == {"id", "key", "kind", "prefix", "allowed_origins", "limits"}
    ident = await store.authenticate_key(created["key"])
    assert ident is not None and ident.kind == "widget"
    assert ident.allowed_origins == ("https://shop.example",)
    listed = (await call(api, "GET", "/tenants/acme", 200))["keys"]
    assert [k["id"] for k in listed] == [created["id"]] and "key" not in listed[0]
    assert created["key"] not in str(listed)
    assert (
        error(await call(api, "POST", "/tenants/acme/keys", 422, json={"kind": "root"}))["param"]
        == "kind"
    )
    bad = {"kind": "widget", "allowed_origins": ["javascript:x"]}
    assert (
        error(await call(api, "POST", "/tenants/acme/keys", 422, json=bad))["param"]
        == "allowed_origins"
    )
    await call(api, "POST", "/tenants/nope/keys", 404, json={"kind": "server"})
    batch = await call(
        api, "POST", "/tenants/acme/keys", 201, json={"kind": "server", "priority": "batch"}
    )
    ident = await store.authenticate_key(batch["key"])
    assert ident is not None and ident.priority == "batch"
    path = f"/tenants/acme/keys/{batch['id']}/priority"
    out = await call(api, "PUT", path, 200, json={"priority": "interactive"})
    assert out["priority"] == "interactive"
    ident = await store.authenticate_key(batch["key"])
    assert ident is not None and ident.priority == "interactive"
    await call(api, "PUT", path, 422, json={"priority": "urgent"})
    revoked = await call(api, "DELETE", f"/tenants/acme/keys/{created['id']}", 200)
    assert revoked["revoked_at"] is not None
    assert await store.authenticate_key(created["key"]) is None
    err = error(await call(api, "DELETE", "/tenants/acme/keys/key_nope", 404))
    assert err["code"] == "key_not_found"
    dump = await dump_tables(store)
    assert created["key"] not in dump and created["key"].split("_", 2)[2] not in dump


async def test_limits(api: TestClient, store: TenantStore) -> None:
    await call(
        api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme", "limits": {"tpm": 9}}
    )
    body = {"rpm": 10, "tpm": 1000, "max_concurrency": 2, "max_output_tokens": None, "weight": 3}
    out = await call(api, "PUT", "/tenants/acme/limits", 200, json=body)
    assert out["limits"] == body
    rt = await store.get_tenant_runtime("acme")
    assert rt is not None and rt.limits.weight == 3.0
    await call(api, "PUT", "/tenants/acme/limits", 422, json={"weight": 0})
    assert rt is not None and (rt.limits.rpm, rt.limits.max_output_tokens) == (
        10,
        store.default_limits.max_output_tokens,
    )
    assert (
        error(await call(api, "PUT", "/tenants/acme/limits", 422, json={"tpm": -1}))["param"]
        == "tpm"
    )
    assert (
        error(await call(api, "PUT", "/tenants/acme/limits", 422, json={"rpm": "x"}))["param"]
        == "rpm"
    )
    await call(api, "PUT", "/tenants/nope/limits", 404, json={})


async def test_cache(api: TestClient, store: TenantStore) -> None:
    await call(api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme"})
    out = await call(api, "GET", "/tenants/acme/cache", 200)
    assert out == {"tenant_id": "acme", **fake_cache("acme")}
    await call(api, "GET", "/tenants/nope/cache", 404)

    async def async_provider(tenant_id: str) -> dict[str, Any]:
        return {"pinned": False}

    for provider, status in ((async_provider, 200), (None, 503)):
        client = await _client(store, cache_provider=provider)
        try:
            await call(client, "GET", "/tenants/acme/cache", status)
        finally:
            await client.close()


async def test_audit(api: TestClient) -> None:
    await call(
        api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme", "system_prompt": "p1"}
    )
    await call(api, "POST", "/tenants", 201, json={"id": "other", "name": "Other"})
    await call(api, "PATCH", "/tenants/acme", 200, json={"name": "A"})
    await call(api, "PUT", "/tenants/acme/system-prompt", 200, json={"text": "very private words"})
    key = await call(api, "POST", "/tenants/acme/keys", 201, json={"kind": "server"})
    await call(api, "DELETE", f"/tenants/acme/keys/{key['id']}", 200)
    await call(api, "PUT", "/tenants/acme/limits", 200, json={"rpm": 3})
    await call(api, "DELETE", "/tenants/acme", 200)
    page = await call(api, "GET", "/audit?tenant=acme", 200)
    assert [a["action"] for a in reversed(page["data"])] == [
        "tenant.create",
        "tenant.update",
        "prompt.set",
        "key.create",
        "key.revoke",
        "limits.set",
        "tenant.delete",
    ]
    assert {a["actor"] for a in page["data"]} == {"admin"}
    text = str(page)
    assert key["key"] not in text and "very private words" not in text
    first = await call(api, "GET", "/audit?limit=3", 200)
    second = await call(api, "GET", f"/audit?limit=3&cursor={first['next_cursor']}", 200)
    assert len(first["data"]) == 3 and first["data"][-1]["id"] > second["data"][0]["id"]
    for cursor in ("abc", "0", str(2**64)):
        assert error(await call(api, "GET", f"/audit?cursor={cursor}", 422))["param"] == "cursor"


async def test_database_unreachable_is_503() -> None:
    broken = TenantStore.open("postgresql+asyncpg://postgres@127.0.0.1:1/none")
    client = await _client(broken)
    try:
        for method, path, body in (
            ("GET", "/tenants", None),
            ("POST", "/tenants", {"id": "acme", "name": "A"}),
            ("PUT", "/tenants/acme/system-prompt", {"text": "x"}),
        ):
            err = error(await call(client, method, path, 503, json=body))
            assert err["code"] == "database_unavailable"
    finally:
        await client.close()
        await broken.aclose()


async def test_partial_failure_is_503_and_rolled_back(
    api: TestClient, store: TenantStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    from tenants import service

    async def broken_audit(*args: object, **kwargs: object) -> None:
        raise OperationalError("INSERT INTO audit_log", {}, ConnectionResetError("gone"))

    monkeypatch.setattr(service, "write_audit", broken_audit)
    body = {"id": "acme", "name": "A", "system_prompt": "p"}
    assert (
        error(await call(api, "POST", "/tenants", 503, json=body))["code"] == "database_unavailable"
    )
    monkeypatch.undo()
    await call(api, "GET", "/tenants/acme", 404)
    assert await dump_tables(store) == ""
