"""Console sessions behind several replicas: two gateways sharing one database and one Redis
honour each other's sign-ins, sign-outs, idle expiry and token revocations; Redis down while a
session is checked is a 401 (back to sign-in), never a 500."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from gateway.admin.session import COOKIE
from tests.conftest import SHARED_REDIS_URL
from tests.gateway.harness import ADMIN_TOKEN, LiveGateway, live_gateway, make_settings
from tests.gateway.redis_server import RedisServer

BEARER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@contextlib.asynccontextmanager
async def replicas(
    db_url: str, tmp_path: Path, model_dir: Path, n: int, **env: str
) -> AsyncIterator[list[LiveGateway]]:
    async with contextlib.AsyncExitStack() as stack:
        gws = []
        for i in range(n):
            settings = make_settings(db_url, tmp_path / f"replica{i}", **env)
            gws.append(await stack.enter_async_context(live_gateway(settings, model_dir)))
        yield gws


def shared(redis_prefix: str, url: str = SHARED_REDIS_URL, **env: str) -> dict[str, str]:
    return {
        "KVGATE_REDIS_URL": url,
        "KVGATE_REDIS_PREFIX": redis_prefix,
        "KVGATE_TENANT_EVENT_CHANNEL": f"{redis_prefix}events",
        **env,
    }


class Browser:
    """A console user: one session cookie, sent to whichever replica the balancer picks."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http
        self.cookie = ""
        self.csrf = ""

    async def sign_in(self, gw: LiveGateway, token: str = ADMIN_TOKEN) -> None:
        url = f"{gw.base_url}/admin/v1/session"
        async with self.http.post(url, json={"token": token}) as resp:
            assert resp.status == 201, await resp.text()
            self.cookie = resp.cookies[COOKIE].value
            self.csrf = (await resp.json())["csrf_token"]

    async def call(
        self, gw: LiveGateway, method: str, path: str, status: int, body: Any = None
    ) -> Any:
        headers = {"Cookie": f"{COOKIE}={self.cookie}", "X-CSRF-Token": self.csrf}
        url = f"{gw.base_url}/admin/v1{path}"
        async with self.http.request(method, url, json=body, headers=headers) as resp:
            data = await resp.json()
            assert resp.status == status, (resp.status, data)
            return data


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        yield Browser(http)


async def refused(browser: Browser, gw: LiveGateway, timeout: float = 15.0) -> None:
    """The cookie is refused (401 session_expired); a principal cached on ``gw`` may take up to
    its TTL to learn of a revocation, so this waits for it with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        headers = {"Cookie": f"{COOKIE}={browser.cookie}"}
        async with browser.http.get(f"{gw.base_url}/admin/v1/tenants", headers=headers) as resp:
            if resp.status == 401:
                assert (await resp.json())["error"]["code"] == "session_expired"
                return
            assert resp.status == 200 and time.monotonic() < deadline, resp.status
        await asyncio.sleep(0.1)


async def test_a_session_from_one_replica_writes_on_another_and_signs_out_on_both(
    gateway_database: str,
    tmp_path: Path,
    demo_model_dir: Path,
    redis_prefix: str,
    shared_redis: Any,
    browser: Browser,
) -> None:
    env = shared(redis_prefix)
    async with replicas(gateway_database, tmp_path, demo_model_dir, 2, **env) as (a, b):
        await browser.sign_in(a)
        await browser.call(b, "POST", "/tenants", 201, {"id": "acme", "name": "Acme"})
        me = await browser.call(b, "GET", "/session", 200)
        assert me["csrf_token"] == browser.csrf
        assert (await browser.call(a, "GET", "/tenants/acme", 200))["name"] == "Acme"
        await browser.call(b, "DELETE", "/session", 200)
        await browser.call(a, "GET", "/tenants", 401)
        await browser.call(b, "GET", "/tenants", 401)


async def test_idle_expiry_ends_the_session_on_every_replica(
    gateway_database: str,
    tmp_path: Path,
    demo_model_dir: Path,
    redis_prefix: str,
    shared_redis: Any,
    browser: Browser,
) -> None:
    env = shared(redis_prefix, KVGATE_ADMIN_SESSION_IDLE_S="2")
    async with replicas(gateway_database, tmp_path, demo_model_dir, 2, **env) as (a, b):
        await browser.sign_in(a)
        await browser.call(b, "GET", "/tenants", 200)
        await asyncio.sleep(2.5)
        await browser.call(a, "GET", "/tenants", 401)
        await browser.call(b, "GET", "/tenants", 401)


async def test_revoking_the_token_ends_its_session_on_every_replica(
    gateway_database: str,
    tmp_path: Path,
    demo_model_dir: Path,
    redis_prefix: str,
    shared_redis: Any,
    browser: Browser,
) -> None:
    env = shared(redis_prefix)
    async with replicas(gateway_database, tmp_path, demo_model_dir, 2, **env) as (a, b):
        admin = await a.admin("POST", "/admins", {"scope": "platform", "access": "viewer"})
        await browser.sign_in(a, admin["token"])
        await browser.call(a, "GET", "/tenants", 200)
        await browser.call(b, "GET", "/tenants", 200)  # B caches the principal too
        await b.admin("DELETE", f"/admins/{admin['id']}")
        await refused(browser, b)
        await refused(browser, a)


async def test_redis_down_fails_closed_with_401_and_sign_in_503(
    gateway_database: str,
    tmp_path: Path,
    demo_model_dir: Path,
    redis_prefix: str,
    browser: Browser,
) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        env = shared(redis_prefix, server.url)
        async with replicas(gateway_database, tmp_path, demo_model_dir, 1, **env) as (gw,):
            await browser.sign_in(gw)
            await browser.call(gw, "GET", "/tenants", 200)
            server.stop()
            with structlog.testing.capture_logs() as events:
                for _ in range(3):
                    err = (await browser.call(gw, "GET", "/tenants", 401))["error"]
                    assert err["code"] == "session_expired"
                err = (await browser.call(gw, "DELETE", "/session", 401))["error"]
                assert err["code"] == "session_expired"
            down = [e for e in events if e["event"] == "admin_sessions_redis_down"]
            assert len(down) == 1, events  # once per outage, not once per request
            url = f"{gw.base_url}/admin/v1/session"
            async with browser.http.post(url, json={"token": ADMIN_TOKEN}) as resp:
                assert resp.status == 503 and COOKIE not in resp.cookies
                assert (await resp.json())["error"]["code"] == "sessions_unavailable"
            async with browser.http.get(f"{gw.base_url}/admin/v1/tenants", headers=BEARER) as r:
                assert r.status == 200  # bearer tokens do not need the session store
    finally:
        server.stop()
