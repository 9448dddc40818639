"""Admin writes are limited per principal; failed sign-ins (a wrong bearer token, a wrong token at
the console's sign-in) per client address, and an address out of them cannot sign in at all
until the block ends, a valid token included. 429s carry ``Retry-After`` and the OpenAI error
shape. With Redis the counts are shared by every replica."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.admin.throttle import AdminThrottle, ThrottleLimits
from gateway.ratelimit import RedisLimiter
from tenants.store import TenantStore
from tests.conftest import SHARED_REDIS_URL
from tests.gateway.admin_clients import BOOTSTRAP, admin_client, bearer, new_admin
from tests.tenants.factories import ADMIN_TOKEN
from tests.tenants.fixtures import db_url, postgresql_url, sqlite_url, store

__all__ = ["db_url", "postgresql_url", "sqlite_url", "store"]

PROXY = (ipaddress.ip_network("127.0.0.0/8"),)  # the test client's address: a trusted proxy


def limits(writes: int = 60, failures: int = 10) -> ThrottleLimits:
    return ThrottleLimits(writes, failures, PROXY)


def client_at(address: str, token: str = ADMIN_TOKEN) -> dict[str, str]:
    return {**bearer(token), "X-Forwarded-For": address}


async def status_of(api: TestClient, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    resp = await api.request(method, f"/admin/v1{path}", **kw)
    return resp.status, (await resp.json(), resp.headers)


def assert_throttled(answer: tuple[int, Any]) -> None:
    status, (body, headers) = answer
    assert status == 429, body
    assert body["error"]["type"] == "rate_limit_exceeded"
    assert body["error"]["code"] == "rate_limit_exceeded" and body["error"]["message"]
    assert int(headers["Retry-After"]) >= 1


@pytest.fixture
async def api(store: TenantStore) -> AsyncIterator[TestClient]:
    client = await admin_client(store, throttle=AdminThrottle(limits(writes=3, failures=3)))
    yield client
    await client.close()


async def test_writes_are_limited_per_principal(api: TestClient) -> None:
    other = (await new_admin(api, "platform", "editor"))["token"]  # write 1 of the bootstrap
    for i in (2, 3):
        body = {"id": f"t{i}", "name": "T"}
        assert (await status_of(api, "POST", "/tenants", json=body, headers=BOOTSTRAP))[0] == 201
    body = {"id": "t4", "name": "T"}
    answer = await status_of(api, "POST", "/tenants", json=body, headers=BOOTSTRAP)
    assert_throttled(answer)
    assert answer[1][1]["x-ratelimit-limit-requests"] == "3"
    assert (await status_of(api, "GET", "/tenants/t4", headers=BOOTSTRAP))[0] == 404  # unwritten
    assert (await status_of(api, "GET", "/tenants", headers=BOOTSTRAP))[0] == 200  # reads: free
    body = {"id": "t5", "name": "T"}
    assert (await status_of(api, "POST", "/tenants", json=body, headers=bearer(other)))[0] == 201


async def test_failed_sign_ins_block_the_address(api: TestClient) -> None:
    here, there = "203.0.113.7", "198.51.100.9"
    wrong = client_at(here, "not-a-token")
    for _ in range(3):
        assert (await status_of(api, "GET", "/tenants", headers=wrong))[0] == 401
    assert_throttled(await status_of(api, "GET", "/tenants", headers=wrong))
    # blocked: the valid token too, and the console's sign-in, before any token is looked at
    assert_throttled(await status_of(api, "GET", "/tenants", headers=client_at(here)))
    sign_in = {"json": {"token": ADMIN_TOKEN}, "headers": {"X-Forwarded-For": here}}
    assert_throttled(await status_of(api, "POST", "/session", **sign_in))
    assert (await status_of(api, "GET", "/tenants", headers=client_at(there)))[0] == 200


async def test_wrong_tokens_at_the_console_sign_in_count(api: TestClient) -> None:
    here = {"X-Forwarded-For": "203.0.113.8"}
    for _ in range(3):
        answer = await status_of(api, "POST", "/session", json={"token": "nope"}, headers=here)
        assert answer[0] == 401
    answer = await status_of(api, "POST", "/session", json={"token": "nope"}, headers=here)
    assert_throttled(answer)
    assert_throttled(await status_of(api, "GET", "/tenants", headers={**BOOTSTRAP, **here}))


async def test_replicas_share_the_counts_through_redis(
    store: TenantStore, redis_prefix: str, shared_redis: Any
) -> None:
    """Two admin apps (two replicas) on one Redis: failures on one count on the other."""
    redis = RedisLimiter.connect(SHARED_REDIS_URL, 1.0, redis_prefix, 30.0)
    apps = [
        await admin_client(store, throttle=AdminThrottle(limits(failures=4), lambda: redis))
        for _ in range(2)
    ]
    try:
        wrong = client_at("203.0.113.9", "not-a-token")
        for api in (*apps, *apps):  # 4 failures, 2 on each replica
            assert (await status_of(api, "GET", "/tenants", headers=wrong))[0] == 401
        assert_throttled(await status_of(apps[0], "GET", "/tenants", headers=wrong))
        assert_throttled(await status_of(apps[1], "GET", "/tenants", headers=wrong))
    finally:
        for api in apps:
            await api.close()
        await redis.close()
