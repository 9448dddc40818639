"""The tenant database refused or stalled (blackholed) behind a TCP proxy, under a live gateway.

Known keys keep chatting from last-known-good state (well past the key cache TTL); unknown keys
and admin calls get an OpenAI-shaped 503 within the database deadline; /readyz answers within
about a second and reports the database degraded, not the gateway dead; admin writes that failed
left nothing behind; after the fault is lifted everything works again.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.lifecycle.dbready import PROBE_MAX_AGE_S, PROBE_TIMEOUT_S
from tenants.events import TenantChanged
from tests.gateway.harness import (
    ADMIN_TOKEN,
    PG_ADMIN_DSN,
    LiveGateway,
    live_gateway,
    make_settings,
)
from tests.reliability._proxy import FaultProxy, fault_proxy

DB_TIMEOUT_S = 1.0
MARGIN_S = 0.5  # scheduling slack on a loaded machine


@asynccontextmanager
async def gateway_behind_proxy(
    database_url: str, model_dir: Path, tmp_path: Path, *, retry_s: float = 0.5
) -> AsyncIterator[tuple[LiveGateway, FaultProxy]]:
    """``retry_s``: one database trial per that many seconds while it is down."""
    async with fault_proxy() as proxy:
        url = database_url.replace(":5432/", f":{proxy.port}/")
        settings = make_settings(
            url,
            tmp_path,
            KVGATE_DB_TIMEOUT_S=str(DB_TIMEOUT_S),
            KVGATE_DB_RETRY_S=str(retry_s),
            KVGATE_KEY_CACHE_TTL_S="0.2",  # outages below outlast it many times over
        )
        async with live_gateway(settings, model_dir) as gw:
            yield gw, proxy


async def chat(gw: LiveGateway, key: str) -> tuple[int, dict[str, Any], float]:
    body = {
        "model": gw.state.model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "temperature": 0,
    }
    started = time.monotonic()
    url = f"{gw.base_url}/v1/chat/completions"
    async with gw.http.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, await r.json(), time.monotonic() - started


async def admin(gw: LiveGateway, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    url = f"{gw.base_url}/admin/v1{path}"
    async with gw.http.request(method, url, json=body, headers=headers) as r:
        return r.status, await r.json()


async def readyz(gw: LiveGateway) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    async with gw.http.get(f"{gw.base_url}/readyz") as r:
        return r.status, await r.json(), time.monotonic() - started


async def readyz_once_back(gw: LiveGateway) -> tuple[int, dict[str, Any]]:
    """/readyz once its database probe has found the database back: the probe's answer is
    reused for about a second (gateway/lifecycle/dbready.py), so an answer given just before the
    database came back may still be served for that long."""
    deadline = time.monotonic() + PROBE_MAX_AGE_S + PROBE_TIMEOUT_S + MARGIN_S
    while True:
        status, ready, _ = await readyz(gw)
        if ready["database"]["status"] == "ok" or time.monotonic() > deadline:
            return status, ready
        await asyncio.sleep(0.05)


async def database_gauges(gw: LiveGateway) -> tuple[str, str]:
    """(kvgate_database_up, kvgate_database_serving_stale) as the metrics listener shows them."""
    text = await (await gw.http.get(gw.metrics_url)).text()
    up = re.search(r"^kvgate_database_up (\S+)$", text, re.M)
    stale = re.search(r"^kvgate_database_serving_stale (\S+)$", text, re.M)
    assert up is not None and stale is not None, text
    return up.group(1), stale.group(1)


def assert_unavailable(status: int, body: dict[str, Any]) -> None:
    assert status == 503, (status, body)
    assert body["error"]["type"] == "service_unavailable"
    assert body["error"]["code"] == "database_unavailable"


async def test_known_keys_keep_chatting_through_refused_and_stalled_database(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with gateway_behind_proxy(gateway_database, demo_model_dir, tmp_path) as (gw, proxy):
        known = await gw.create_tenant("known")
        # One tenant per fault whose key is never used before it: unknown to the key cache.
        unknown = [await gw.create_tenant("unknown") for _ in range(2)]
        assert (await chat(gw, known.key))[0] == 200
        for fault, other in zip((proxy.refuse, proxy.blackhole), unknown, strict=True):
            await fault()
            await asyncio.sleep(0.3)  # the key cache TTL has passed: entries are stale
            for _ in range(3):
                status, _, took = await chat(gw, known.key)
                assert status == 200, fault.__name__
                assert took < DB_TIMEOUT_S + MARGIN_S
            status, body, took = await chat(gw, other.key)
            assert_unavailable(status, body)
            assert took < DB_TIMEOUT_S + MARGIN_S
            started = time.monotonic()
            status, body = await admin(gw, "POST", "/tenants", {"id": "late", "name": "late"})
            assert_unavailable(status, body)
            assert time.monotonic() - started < DB_TIMEOUT_S + MARGIN_S
            status, ready, took = await readyz(gw)
            assert took < 1.0 + MARGIN_S
            assert status == 200 and ready["ready"] is True, ready
            assert ready["database"]["status"] == "degraded"
            assert ready["database"]["reachable"] is False
            assert ready["database"]["serving_last_known_good"] is True
            assert ready["database"]["oldest_cached_read_s"] >= 0.3  # read before the fault
            assert await database_gauges(gw) == ("0.0", "1.0")
            await proxy.restore()
            status, ready = await readyz_once_back(gw)
            assert status == 200 and ready["database"]["status"] == "ok", ready
            assert await database_gauges(gw) == ("1.0", "0.0")
            assert (await chat(gw, other.key))[0] == 200  # read through again
        status, _ = await admin(gw, "GET", "/tenants/late")
        assert status == 404  # the writes refused during the outages left nothing
        assert gw.state.keys.stale_served > 0
        gw.state.keys.check_integrity()
        await gw.state.store.check_integrity()


async def test_revocation_event_during_an_outage_still_applies(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with gateway_behind_proxy(gateway_database, demo_model_dir, tmp_path) as (gw, proxy):
        revoked = await gw.create_tenant("revoked")
        kept = await gw.create_tenant("kept")
        for t in (revoked, kept):
            assert (await chat(gw, t.key))[0] == 200
        await proxy.blackhole()
        # Another replica revoked a key of this tenant; its event reached this one.
        await gw.state.store.bus.deliver(TenantChanged(revoked.id, "keys"))
        status, body, took = await chat(gw, revoked.key)
        assert_unavailable(status, body)  # cannot re-read the key: never served stale
        assert took < DB_TIMEOUT_S + MARGIN_S
        assert (await chat(gw, kept.key))[0] == 200
        await gw.state.store.bus.deliver(TenantChanged(kept.id, "deleted"))
        assert_unavailable(*(await chat(gw, kept.key))[:2])
        await proxy.restore()


async def test_write_stalled_mid_transaction_leaves_nothing(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    """The tenant and prompt rows are written, then the audit insert waits on a lock held
    elsewhere: the deadline ends the unit of work, which rolls back as a whole."""
    db_name = gateway_database.rsplit("/", 1)[1]
    async with gateway_behind_proxy(gateway_database, demo_model_dir, tmp_path) as (gw, _):
        blocker = await asyncpg.connect(PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{db_name}")
        try:
            tr = blocker.transaction()
            await tr.start()
            await blocker.execute("LOCK TABLE audit_log IN EXCLUSIVE MODE")
            started = time.monotonic()
            body = {"id": "stalled", "name": "stalled", "system_prompt": "be brief"}
            status, err = await admin(gw, "POST", "/tenants", body)
            assert_unavailable(status, err)
            assert time.monotonic() - started < DB_TIMEOUT_S + MARGIN_S
            await tr.rollback()

            # The server side rolled back too (statement timeout), leaving no row anywhere.
            async def leftovers() -> int:
                rows = 0
                for table, column in (("tenants", "id"), ("system_prompts", "tenant_id")):
                    sql = f"SELECT count(*) FROM {table} WHERE {column} = 'stalled'"
                    rows += int(await blocker.fetchval(sql))
                return rows

            assert await leftovers() == 0
            await asyncio.sleep(DB_TIMEOUT_S + 0.5)  # past the server-side statement timeout
            assert await leftovers() == 0
        finally:
            await blocker.close()
        status, _ = await admin(gw, "POST", "/tenants", {"id": "after", "name": "after"})
        assert status == 201  # the database serves writes again
        await gw.state.store.check_integrity()


# Once a partition ends, the admin API answers within one failed trial that may still be under
# way (the database deadline), the retry interval and scheduling slack.
ADMIN_BACK_S = DB_TIMEOUT_S + 0.5 + 2 * MARGIN_S
POOL_SIZE = 5  # SQLAlchemy's default QueuePool size (tenants/db.py keeps it)


@pytest.mark.parametrize(
    ("begin", "end"),
    [("blackhole", "restore"), ("blackhole", "reopen"), ("partition", "heal")],
)
async def test_the_admin_api_answers_soon_after_a_partition_ends(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path, begin: str, end: str
) -> None:
    """The pool is full of idle connections when the partition begins. ``restore``: the proxy
    closes the connections it cut; ``reopen``: they stay silent for good (a firewall or NAT
    between forgot them), only new connections pass; ``heal``: nothing was lost, they carry
    on."""
    async with gateway_behind_proxy(gateway_database, demo_model_dir, tmp_path) as (gw, proxy):
        tenant = await gw.create_tenant("partitioned")
        pool = gw.state.store.engine.sync_engine.pool
        for _ in range(10):  # concurrent reads until the pool holds its idle connections
            reads = [admin(gw, "GET", f"/tenants/{tenant.id}") for _ in range(2 * POOL_SIZE)]
            assert all(status == 200 for status, _ in await asyncio.gather(*reads))
            if pool.checkedin() >= POOL_SIZE:
                break
        assert pool.checkedin() >= POOL_SIZE, pool.status()
        await getattr(proxy, begin)()
        status, body = await admin(gw, "GET", f"/tenants/{tenant.id}")
        assert_unavailable(status, body)  # marked down: one trial per retry interval from now
        await getattr(proxy, end)()
        restored = time.monotonic()
        while True:
            status, body = await admin(gw, "GET", f"/tenants/{tenant.id}")
            if status == 200:
                break
            assert time.monotonic() - restored < ADMIN_BACK_S, (status, body, pool.status())
            await asyncio.sleep(0.05)
        status, body = await admin(gw, "PATCH", f"/tenants/{tenant.id}", {"name": "after"})
        assert status == 200, body
        await gw.state.store.check_integrity()
