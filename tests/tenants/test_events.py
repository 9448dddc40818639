from __future__ import annotations

import asyncio
import json
import secrets

import pytest
import redis.asyncio as aioredis

from tenants.events import EventBus, RedisEventBridge, TenantChanged
from tenants.schemas import KeyCreate, LimitsIn, TenantPatch
from tenants.store import TenantStore
from tests.conftest import SHARED_REDIS_URL
from tests.tenants.factories import make_tenant


async def test_bus_order_isolation_and_unsubscribe() -> None:
    bus = EventBus()
    got: list[str] = []

    async def first(e: TenantChanged) -> None:
        got.append(f"1:{e.kind}")

    async def broken(e: TenantChanged) -> None:
        raise RuntimeError("listener bug")

    async def last(e: TenantChanged) -> None:
        got.append(f"3:{e.kind}")

    unsub = bus.subscribe(first)
    bus.subscribe(broken)
    bus.subscribe(last)
    await bus.publish(TenantChanged("a", "created", 1))
    unsub()
    await bus.publish(TenantChanged("a", "deleted"))
    assert got == ["1:created", "3:created", "3:deleted"]


def test_event_json_round_trip() -> None:
    e = TenantChanged("acme", "prompt", 3)
    assert TenantChanged.from_json(json.loads(json.dumps(e.to_json()))) == e
    with pytest.raises(ValueError):
        TenantChanged.from_json({"tenant_id": "a", "kind": "exploded"})


async def test_store_emits_after_commit(store: TenantStore) -> None:
    """Each mutation emits one event, and a listener re-reading the database sees the change."""
    seen: list[tuple[TenantChanged, int | None]] = []

    async def listener(e: TenantChanged) -> None:
        rt = await store.get_tenant_runtime(e.tenant_id)
        seen.append((e, rt.prompt_version if rt else None))

    store.bus.subscribe(listener)
    tid = await make_tenant(store, system_prompt="v1")
    await store.set_system_prompt(tid, "v2", actor="t")
    await store.update_tenant(tid, TenantPatch(name="n"), actor="t")
    await store.set_limits(tid, LimitsIn(rpm=3), actor="t")
    created = await store.create_key(tid, KeyCreate(kind="server"), actor="t")
    await store.revoke_key(tid, created.id, actor="t")
    await store.delete_tenant(tid, actor="t")
    assert [(e.kind, e.prompt_version, seen_v) for e, seen_v in seen] == [
        ("created", 1, 1),
        ("prompt", 2, 2),
        ("updated", 2, 2),
        ("limits", 2, 2),
        ("keys", None, 2),
        ("keys", None, 2),
        ("deleted", None, 2),
    ]
    # A failed mutation emits nothing.
    with pytest.raises(Exception):  # noqa: B017
        await store.set_system_prompt("missing", "x", actor="t")
    assert len(seen) == 7


async def _wait_for(items: list[TenantChanged], n: int) -> None:
    for _ in range(200):
        if len(items) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"expected {n} events, got {items}")


async def test_redis_bridge_between_replicas(redis_channel: str) -> None:
    buses = [EventBus(), EventBus()]
    received: list[list[TenantChanged]] = [[], []]
    for bus, sink in zip(buses, received, strict=True):

        async def listen(e: TenantChanged, sink: list[TenantChanged] = sink) -> None:
            sink.append(e)

        bus.subscribe(listen)
    bridges = [RedisEventBridge.from_url(b, SHARED_REDIS_URL, redis_channel) for b in buses]
    for bridge in bridges:
        await bridge.start()
    try:
        await buses[0].publish(TenantChanged("acme", "prompt", 4))
        await _wait_for(received[1], 1)
        await buses[1].publish(TenantChanged("acme", "keys"))
        await _wait_for(received[0], 2)
        # A malformed message on the channel is ignored, later ones still arrive.
        raw = aioredis.from_url(SHARED_REDIS_URL)
        await raw.publish(redis_channel, b"{not json")
        await raw.aclose()
        await buses[0].publish(TenantChanged("beta", "deleted"))
        await _wait_for(received[1], 3)
        await asyncio.sleep(0.05)  # any echo of a replica's own event would have arrived
    finally:
        for bridge in bridges:
            await bridge.aclose()
    # Each replica saw its own events once (locally) and the other's once (via Redis).
    expected = [
        TenantChanged("acme", "prompt", 4),
        TenantChanged("acme", "keys"),
        TenantChanged("beta", "deleted"),
    ]
    assert received[0] == expected
    assert received[1] == expected


async def test_redis_bridge_resubscribes_after_connection_loss(redis_channel: str) -> None:
    name = f"kvgate-test-bridge-{secrets.token_hex(4)}"
    bus, got, resyncs = EventBus(), [], []

    async def listen(e: TenantChanged) -> None:
        got.append(e)

    async def on_resync() -> None:
        resyncs.append(1)

    bus.subscribe(listen)
    bridge = RedisEventBridge(
        bus,
        aioredis.from_url(SHARED_REDIS_URL, client_name=name),
        redis_channel,
        on_resync=on_resync,
        retry_s=0.02,
    )
    sender = RedisEventBridge.from_url(EventBus(), SHARED_REDIS_URL, redis_channel)
    admin = aioredis.from_url(SHARED_REDIS_URL)
    await bridge.start()
    await sender.start()
    try:
        # Kill only this bridge's own connections (matched by its unique client name).
        for client in await admin.client_list():
            if client.get("name") == name:
                await admin.client_kill_filter(_id=client["id"])
        for _ in range(300):
            if resyncs:
                break
            await asyncio.sleep(0.01)
        assert resyncs == [1]
        await sender.send(TenantChanged("acme", "limits"))
        await _wait_for(got, 1)
        assert got == [TenantChanged("acme", "limits")]
    finally:
        await bridge.aclose()
        await sender.aclose()
        await admin.aclose()
