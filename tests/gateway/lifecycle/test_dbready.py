"""/readyz's database probe: reused for about a second and shared by concurrent callers, so
calling /readyz (a public route) in a loop costs the database about one ``SELECT 1`` a second."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

from sqlalchemy import event

from gateway.access.auth import KeyCache
from gateway.lifecycle.dbready import PROBE_MAX_AGE_S, DatabaseProbe
from tenants.errors import StoreUnavailable
from tenants.health import DbHealth
from tenants.store import TenantStore
from tests.gateway.harness import live_gateway, make_settings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class PingStore:
    """What the probe reads of a store: ``ping`` (counted, gated), ``deadline_s``, ``health``."""

    def __init__(self, clock: Clock) -> None:
        self.health = DbHealth(1.0, clock)
        self.deadline_s = 3.0
        self.pings = 0
        self.up = True
        self.gate = asyncio.Event()
        self.gate.set()

    async def ping(self, timeout_s: float) -> bool:
        self.pings += 1
        await self.gate.wait()
        if not self.up:
            self.health.failed(StoreUnavailable("down"))
        return self.up


def make() -> tuple[DatabaseProbe, PingStore, KeyCache, Clock]:
    clock = Clock()
    store = PingStore(clock)
    keys = KeyCache(cast(TenantStore, store), ttl_s=5.0, clock=clock)
    return DatabaseProbe(clock=clock), store, keys, clock


async def test_the_probe_is_reused_for_a_second() -> None:
    probe, store, keys, clock = make()
    ts = cast(TenantStore, store)
    for _ in range(100):
        assert (await probe.readiness(ts, keys)).status == "ok"
    assert store.pings == 1
    store.up = False
    clock.now += PROBE_MAX_AGE_S - 0.01
    assert (await probe.readiness(ts, keys)).status == "ok"  # the answer of a moment ago
    clock.now += 0.01
    assert (await probe.readiness(ts, keys)).status == "degraded"
    assert store.pings == 2


async def test_concurrent_callers_share_one_probe_even_if_one_goes_away() -> None:
    probe, store, keys, _ = make()
    store.gate.clear()
    calls = [
        asyncio.ensure_future(probe.readiness(cast(TenantStore, store), keys)) for _ in range(50)
    ]
    await asyncio.sleep(0)
    calls[0].cancel()
    store.gate.set()
    results = await asyncio.gather(*calls[1:])
    assert {r.status for r in results} == {"ok"} and store.pings == 1


async def test_readyz_in_a_loop_costs_about_one_select_per_second(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        statements: list[str] = []

        def count(conn: object, cursor: object, statement: str, *rest: object) -> None:
            statements.append(statement)

        engine = gw.state.store.engine.sync_engine
        event.listen(engine, "before_cursor_execute", count)
        try:
            started = time.monotonic()
            for _ in range(10):
                replies = await asyncio.gather(
                    *(gw.http.get(f"{gw.base_url}/readyz") for _ in range(10))
                )
                for r in replies:
                    assert r.status == 200 and (await r.json())["database"]["status"] == "ok"
                    r.release()
            elapsed = time.monotonic() - started
        finally:
            event.remove(engine, "before_cursor_execute", count)
        probes = [s for s in statements if s.strip().upper() == "SELECT 1"]
        # 100 calls: one probe per started second of the loop (at most), not one per call.
        assert 1 <= len(probes) <= int(elapsed / PROBE_MAX_AGE_S) + 1, (len(probes), elapsed)
