"""Admission scopes: which limits a request must fit in, and how they show at the HTTP surface
(per-key limits, widget visitors behind trusted proxies, limit changes)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.ratelimit.scopes import (
    IPNetwork,
    VisitorDefaults,
    admission_scopes,
    client_address,
    visitor_address,
)
from gateway.settings import Settings, SettingsError
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


V6_PROXIES = (ipaddress.ip_network("2001:db8:ffff::/48"), ipaddress.ip_network("::1/128"))

# (peer, X-Forwarded-For, trusted proxies, client address)
CLIENT_ADDRESSES = [
    # no trusted proxy, or a peer that is not one: the peer, whatever the header says
    ("192.0.2.1", "203.0.113.5", (), "192.0.2.1"),
    ("192.0.2.1", "203.0.113.5", PROXIES, "192.0.2.1"),
    ("2001:db8::1", "203.0.113.5", V6_PROXIES, "2001:db8::1"),
    # a trusted peer: its hop; proxies are CIDRs (10.0.0.0/8) or single addresses (/32)
    ("10.1.2.3", "203.0.113.5", PROXIES, "203.0.113.5"),
    ("127.0.0.1", "203.0.113.5", PROXIES, "203.0.113.5"),
    ("127.0.0.2", "203.0.113.5", PROXIES, "127.0.0.2"),
    ("2001:db8:ffff:1::9", "2001:db8:1:2::7", V6_PROXIES, "2001:db8:1:2::7"),
    ("::1", "203.0.113.5", V6_PROXIES, "203.0.113.5"),
    # the right-most hop that is not a trusted proxy: the client cannot pick its own address
    ("10.1.2.3", "1.1.1.1, 203.0.113.5, 10.9.9.9", PROXIES, "203.0.113.5"),
    ("10.1.2.3", "1.1.1.1,203.0.113.5,,10.9.9.9 ", PROXIES, "203.0.113.5"),
    ("10.1.2.3", "garbage, 203.0.113.5", PROXIES, "203.0.113.5"),
    # every hop trusted: the left-most
    ("10.1.2.3", "10.0.0.7, 10.0.0.8", PROXIES, "10.0.0.7"),
    # IPv4-mapped IPv6 (a dual-stack listener's peers) is IPv4: trusted by its IPv4 entry
    ("::ffff:10.1.2.3", "203.0.113.5", PROXIES, "203.0.113.5"),
    ("::ffff:192.0.2.1", None, PROXIES, "192.0.2.1"),
    ("10.1.2.3", "::ffff:203.0.113.5", PROXIES, "203.0.113.5"),
    ("10.1.2.3", "::ffff:10.0.0.7, ::ffff:203.0.113.5, 10.0.0.8", PROXIES, "203.0.113.5"),
    # hops as proxies write them: with a port, bracketed, with a zone
    ("10.1.2.3", "203.0.113.5:51234", PROXIES, "203.0.113.5"),
    ("10.1.2.3", "[2001:db8:1:2::7]:443", PROXIES, "2001:db8:1:2::7"),
    ("10.1.2.3", "[2001:db8:1:2::7]", PROXIES, "2001:db8:1:2::7"),
    ("10.1.2.3", "2001:DB8:1:2:0::7", PROXIES, "2001:db8:1:2::7"),
    ("10.1.2.3", "fe80::1%eth0", PROXIES, "fe80::1"),
    # a hop that is no address: one "unknown" visitor, never the hop's text (a new visitor each)
    ("10.1.2.3", "not-an-ip", PROXIES, "unknown"),
    ("10.1.2.3", "203.0.113.5, not-an-ip", PROXIES, "unknown"),
    ("10.1.2.3", "203.0.113.5:port", PROXIES, "unknown"),
    ("10.1.2.3", "[2001:db8::1", PROXIES, "unknown"),
    ("10.1.2.3", "[2001:db8::1]x", PROXIES, "unknown"),
    ("10.1.2.3", "unknown", PROXIES, "unknown"),
    # no header, an empty one: the peer
    ("10.1.2.3", "", PROXIES, "10.1.2.3"),
    ("10.1.2.3", " , ", PROXIES, "10.1.2.3"),
    (None, "203.0.113.5", PROXIES, "unknown"),
]


@pytest.mark.parametrize(("peer", "forwarded", "trusted", "expected"), CLIENT_ADDRESSES)
def test_client_address(
    peer: str | None, forwarded: str | None, trusted: tuple[IPNetwork, ...], expected: str
) -> None:
    assert client_address(peer, forwarded, trusted) == expected


# (client address, IPv6 prefix, visitor address)
VISITOR_ADDRESSES = [
    ("203.0.113.5", 64, "203.0.113.5"),
    ("2001:db8:1:2::7", 64, "2001:db8:1:2::/64"),
    ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 64, "2001:db8:1:2::/64"),
    ("2001:db8:1:3::7", 64, "2001:db8:1:3::/64"),
    ("2001:db8:1:2::7", 56, "2001:db8:1::/56"),
    ("2001:db8:1:2ff::7", 56, "2001:db8:1:200::/56"),
    ("2001:db8:1:2::7", 128, "2001:db8:1:2::7/128"),
    ("::ffff:203.0.113.5", 64, "203.0.113.5"),
    ("unknown", 64, "unknown"),
]


@pytest.mark.parametrize(("address", "prefix", "expected"), VISITOR_ADDRESSES)
def test_visitor_address_groups_ipv6_by_prefix(address: str, prefix: int, expected: str) -> None:
    assert visitor_address(address, prefix) == expected


def test_one_ipv6_network_is_one_visitor_scope() -> None:
    widget = KeyIdentity("t1", "k2", "widget", (ORIGIN,))
    defaults = VisitorDefaults(20, 20_000, 2)

    def scope_of(address: str) -> str:
        visitor = visitor_address(client_address("10.1.2.3", address, PROXIES))
        return admission_scopes(runtime(), widget, None, visitor, defaults)[-1].id

    assert scope_of("2001:db8:1:2::1") == scope_of("2001:db8:1:2:ffff:1:2:3")
    assert scope_of("2001:db8:1:2::1") != scope_of("2001:db8:1:3::1")
    assert scope_of("203.0.113.5") == scope_of("::ffff:203.0.113.5")


def test_the_prefix_and_proxies_settings() -> None:
    base = {"KVGATE_DATABASE_URL": "sqlite+aiosqlite:///:memory:"}
    rl = Settings.from_env(base).ratelimit
    assert (rl.visitor_ipv6_prefix, rl.trusted_proxies) == (64, ())
    rl = Settings.from_env(
        {
            **base,
            "KVGATE_VISITOR_IPV6_PREFIX": "56",
            "KVGATE_TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.7, 2001:db8::/32",
        }
    ).ratelimit
    assert rl.visitor_ipv6_prefix == 56
    assert [str(n) for n in rl.trusted_proxies] == ["10.0.0.0/8", "192.0.2.7/32", "2001:db8::/32"]
    for name, bad in (
        ("KVGATE_VISITOR_IPV6_PREFIX", "0"),
        ("KVGATE_VISITOR_IPV6_PREFIX", "129"),
        ("KVGATE_VISITOR_IPV6_PREFIX", "/64"),
        ("KVGATE_TRUSTED_PROXIES", "10.0.0.1/8"),
        ("KVGATE_TRUSTED_PROXIES", "proxy.internal"),
    ):
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({**base, name: bad})


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
