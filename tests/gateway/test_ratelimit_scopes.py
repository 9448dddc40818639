"""Admission scopes: which limits a request must fit in, and how they show at the HTTP surface
(per-key limits, widget visitors behind trusted proxies, limit changes)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import asyncpg

from gateway.ratelimit.scopes import VisitorDefaults, admission_scopes, client_address
from tenants.runtime import KeyIdentity, TenantRuntime
from tenants.settings import Limits as StoredLimits
from tests.gateway.harness import LiveGateway, live_gateway, make_settings

ORIGIN = "https://shop.example"
PROXIES = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("127.0.0.1/32"))


def runtime(visitor: StoredLimits | None = None) -> TenantRuntime:
    return TenantRuntime(
        "t1",
        "active",
        "salt",
        None,
        None,
        StoredLimits(600, 200_000, 16, 1024),
        True,
        visitor_limits=visitor or StoredLimits(),
    )


def test_scopes_of_server_widget_and_end_user_traffic() -> None:
    defaults = VisitorDefaults(20, 20_000, 2)
    server = KeyIdentity("t1", "k1", "server", ())
    only_tenant = admission_scopes(runtime(), server, None, "192.0.2.1", defaults)
    assert [(s.kind, s.limits.rpm) for s in only_tenant] == [("tenant", 600)]

    limited = KeyIdentity("t1", "k1", "server", (), rpm=5, max_concurrency=1)
    with_key = admission_scopes(runtime(), limited, None, "192.0.2.1", defaults)
    assert [s.kind for s in with_key] == ["tenant", "key"]
    assert (with_key[1].id, with_key[1].limits.rpm, with_key[1].limits.tpm) == ("k1", 5, 0)

    widget = KeyIdentity("t1", "k2", "widget", (ORIGIN,))
    own = StoredLimits(rpm=3, tpm=None, max_concurrency=None)
    by_address = admission_scopes(runtime(own), widget, None, "192.0.2.1", defaults)
    visitor = by_address[-1]
    assert visitor.kind == "visitor" and "192.0.2.1" not in visitor.id  # hashed
    assert (visitor.limits.rpm, visitor.limits.tpm, visitor.limits.max_concurrency) == (
        3,
        20_000,
        2,
    )
    other = admission_scopes(runtime(own), widget, None, "192.0.2.2", defaults)[-1]
    assert other.id != visitor.id
    # A session's end user is the visitor wherever it connects from, with any key kind.
    a = admission_scopes(runtime(), server, "user-7", "192.0.2.1", defaults)[-1]
    b = admission_scopes(runtime(), widget, "user-7", "192.0.2.9", defaults)[-1]
    assert a.kind == b.kind == "visitor" and a.id == b.id != visitor.id


def test_client_address_believes_forwarded_for_only_from_trusted_proxies() -> None:
    assert client_address("192.0.2.1", "203.0.113.5", ()) == "192.0.2.1"
    assert client_address("192.0.2.1", "203.0.113.5", PROXIES) == "192.0.2.1"  # not a proxy
    assert client_address("10.1.2.3", "203.0.113.5", PROXIES) == "203.0.113.5"
    # A client cannot pick its address by sending its own X-Forwarded-For: the right-most
    # untrusted hop (what the trusted proxy saw) counts.
    assert client_address("10.1.2.3", "1.1.1.1, 203.0.113.5, 10.9.9.9", PROXIES) == "203.0.113.5"
    assert client_address("10.1.2.3", "not-an-ip", PROXIES) == "unknown"
    assert client_address("10.1.2.3", "", PROXIES) == "10.1.2.3"
    assert client_address(None, "203.0.113.5", PROXIES) == "unknown"


async def _sql(database_url: str, statement: str, *args: Any) -> None:
    conn = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    try:
        await conn.execute(statement, *args)
    finally:
        await conn.close()


async def chat(
    gw: LiveGateway, key: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    body = {"model": gw.state.model_name, "messages": [{"role": "user", "content": "hi"}]}
    body["max_tokens"] = 1
    url = f"{gw.base_url}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {key}", **(headers or {})}
    async with gw.http.post(url, json=body, headers=auth) as r:
        return r.status, dict(r.headers), await r.json()


async def test_key_visitor_and_changed_limits_over_http(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(
        gateway_database,
        tmp_path,
        KVGATE_TRUSTED_PROXIES="127.0.0.1/32",
        KVGATE_VISITOR_RPM="2",
    )
    async with live_gateway(settings, demo_model_dir) as gw:
        # A key with an RPM of its own, below the tenant's.
        t = await gw.create_tenant("scoped", limits={"rpm": 100})
        await _sql(gateway_database, "UPDATE api_keys SET rpm = 2 WHERE tenant_id = $1", t.id)
        assert [(await chat(gw, t.key))[0] for _ in range(2)] == [200, 200]
        status, headers, body = await chat(gw, t.key)
        assert status == 429 and "(scope: key)" in body["error"]["message"]
        assert headers["x-ratelimit-scope"] == "key"
        assert headers["x-ratelimit-limit-requests"] == "2"

        # Widget visitors, told apart by the address the trusted proxy forwards.
        created = await gw.admin(
            "POST", f"/tenants/{t.id}/keys", {"kind": "widget", "allowed_origins": [ORIGIN]}
        )
        widget = created["key"]

        def visitor(address: str) -> dict[str, str]:
            return {"Origin": ORIGIN, "X-Forwarded-For": address}

        first = [(await chat(gw, widget, visitor("203.0.113.5")))[0] for _ in range(2)]
        assert first == [200, 200]
        status, headers, body = await chat(gw, widget, visitor("203.0.113.5"))
        assert status == 429 and headers["x-ratelimit-scope"] == "visitor"
        assert "(scope: visitor)" in body["error"]["message"]
        assert (await chat(gw, widget, visitor("203.0.113.6")))[0] == 200

        # A limit raised by the admin API applies to the very next request.
        low = await gw.create_tenant("raise", limits={"rpm": 1})
        assert (await chat(gw, low.key))[0] == 200
        assert (await chat(gw, low.key))[0] == 429
        await gw.admin("PUT", f"/tenants/{low.id}/limits", {"rpm": 600})
        status, headers, _ = await chat(gw, low.key)
        assert status == 200 and headers["x-ratelimit-remaining-requests"] == "598"
