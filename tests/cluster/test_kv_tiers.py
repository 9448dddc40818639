"""Tiers across the worker protocol: pin handles carry their tier, KV events carry tier moves,
and the gateway's KV-event index keeps host-tier blocks (preferring device holders)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import msgspec
import pytest

from engine.core.kv import BlockState, PinHandle, PrefixCache
from engine.core.kv.hashing import block_keys, root_key
from engine.remote import messages as m
from engine.remote.client import WorkerClient
from engine.remote.messages import REMOVED, STORED, TIER, KvEvent, kv_events
from engine.serving.worker.events import KvEventHub
from gateway.cluster.admin import cluster_report
from gateway.cluster.kvindex import DEVICE, HOST, KvIndex
from gateway.cluster.local import LocalWorker
from gateway.prompts.pins import PINNED, PinManager, PromptEntry
from tests.cluster.workers import TOKEN, cluster_engine, start_workers, stop_workers, worker_env

BS = 16


# -- pin handles on the wire -------------------------------------------------------------------
def test_pin_handles_keep_their_tier_on_the_wire() -> None:
    def through(body: dict[str, Any]) -> PinHandle:
        reply = m.decode_reply(msgspec.msgpack.encode(["pinned", 1, body]))
        assert isinstance(reply, m.Pinned)
        return reply.handle

    for handle in (PinHandle(3, "ns", (1, 2), 32), PinHandle(4, "ns", (), 48, "host")):
        data = msgspec.to_builtins(handle)
        assert data["tier"] == handle.tier
        assert through(data) == handle
        assert m.decode_reply(m.encode(m.Pinned(1, handle))) == m.Pinned(1, handle)
    legacy = {"pin_id": 5, "namespace": "ns", "block_ids": [7], "num_tokens": 16}
    assert through(legacy).tier == "device"  # a worker from before the host tier
    with pytest.raises(m.WireError, match="tier"):
        through({**legacy, "tier": "disk"})


# -- KV events with tiers, and the index built from them --------------------------------------
def _truth(cache: PrefixCache) -> dict[str, int]:
    """Where the cache itself holds each key: READY device blocks and host entries."""
    bits: dict[str, int] = {}
    for key, block in cache.index._map.items():  # type: ignore[union-attr]
        if block.state is BlockState.READY:
            bits[key.hex()] = DEVICE
    for key in cache.tiers.host.entries:
        bits[key.hex()] = bits.get(key.hex(), 0) | HOST
    return bits


def _index_view(index: KvIndex, keys: set[str]) -> dict[str, int]:
    return {k: index.tiers(k)["w"] for k in keys if index.tiers(k)}


def _cached(cache: PrefixCache, rid: str, tokens: list[int]) -> None:
    cache.allocate(rid, "t", tokens)
    cache.commit(rid, len(tokens))
    cache.free(rid)


def _settle(cache: PrefixCache, hub: KvEventHub, q: Any, index: KvIndex) -> list[list[Any]]:
    """The events since the last call, applied to ``index``; returned as they travel (arrays)."""
    cache.finish_transfers(cache.take_transfers())
    hub.drain()
    events: list[KvEvent] = []
    while not q.empty():
        events += q.get_nowait()
    index.apply("w", events)
    index.check_integrity()
    return msgspec.to_builtins(events)


def test_tier_events_follow_offload_restore_and_host_drops() -> None:
    hub = KvEventHub()
    q = hub.subscribe()
    cache = PrefixCache(4, 4, listener=hub, host_blocks=2)
    index = KvIndex()
    seen: set[str] = set()
    first = list(range(8))

    _cached(cache, "a", first)
    events = _settle(cache, hub, q, index)
    seen |= {e[2] for e in events if e[0] == STORED}
    assert _index_view(index, seen) == _truth(cache) == dict.fromkeys(seen, DEVICE)

    cache.evict(4)  # offloaded: "t" host before "r", so the worker still holds them
    events = _settle(cache, hub, q, index)
    assert [e[0] for e in events] == [TIER, REMOVED, TIER, REMOVED]
    assert all(e[2] == "host" for e in events if e[0] == TIER)
    assert _index_view(index, seen) == _truth(cache) == dict.fromkeys(seen, HOST)
    assert index.longest("t", [*first, 99], 4) == (2, frozenset({"w"}))

    cache.allocate("b", "t", [*first, 99])  # restored from the host: "t" device
    events = _settle(cache, hub, q, index)
    assert [e[2] for e in events if e[0] == TIER] == ["device", "device"]
    assert _index_view(index, seen) == _truth(cache) == dict.fromkeys(seen, DEVICE | HOST)
    cache.free("b")

    second = list(range(100, 108))
    _cached(cache, "c", second)
    cache.evict(4)  # the host is full: the first prompt's entries are dropped ("t" null)
    events = _settle(cache, hub, q, index)
    seen |= {e[2] for e in events if e[0] == STORED}
    assert [e for e in events if e[0] == TIER and e[2] is None]
    assert _index_view(index, seen) == _truth(cache)
    assert index.longest("t", [*first, 99], 4) == (0, frozenset())
    assert hub.tiered == 8


def test_index_prefers_device_holders_but_counts_host_blocks() -> None:
    ids = list(range(3 * BS + 1))
    keys = [k.hex() for k in block_keys(root_key("t"), ids, BS, 0, 3)]
    index = KvIndex()
    index.apply("a", kv_events([[STORED, "ns", k, None] for k in keys]))
    index.apply("b", kv_events([[STORED, "ns", k, None] for k in keys[:2]]))
    assert index.longest("t", ids, BS) == (3, frozenset({"a"}))
    index.apply("a", kv_events([[TIER, keys[2], "host"], [REMOVED, keys[2]]]))
    assert index.longest("t", ids, BS) == (3, frozenset({"a"}))  # a copy-in beats recompute
    index.apply("b", kv_events([[STORED, "ns", keys[2], None]]))
    assert index.longest("t", ids, BS) == (3, frozenset({"b"}))  # same depth: device first
    index.apply("a", kv_events([[TIER, keys[2], None]]))
    assert index.tiers(keys[2]) == {"b": DEVICE}
    index.apply("b", kv_events([[REMOVED, keys[2]], [TIER, keys[1], "host"]]))
    assert index.longest("t", ids, BS) == (2, frozenset({"a", "b"}))
    assert index.tiers(keys[1]) == {"a": DEVICE, "b": DEVICE | HOST}
    index.check_integrity()


# -- through a real worker process -------------------------------------------------------------
CAP_FRACTION = "0.05"  # 6 of the 128 device blocks may be pinned; beyond: host memory


@pytest.fixture(scope="module")
def host_tier_worker(demo_model_dir: Path) -> Iterator[LocalWorker]:
    env = worker_env(KVGATE_HOST_KV_BYTES=str(4 << 20), KVGATE_PIN_CAP_FRACTION=CAP_FRACTION)
    (worker,) = start_workers(demo_model_dir, ["h0"], env=env)
    yield worker
    stop_workers([worker])


def _prompt(base: int, blocks: int) -> list[int]:
    return [(base + i * 13) % 1500 + 3 for i in range(blocks * BS)]


async def test_pins_report_their_tier_per_worker_through_a_real_worker(
    host_tier_worker: LocalWorker,
) -> None:
    async with aiohttp.ClientSession() as http:
        client = WorkerClient(host_tier_worker.url, TOKEN, http, timeout_s=30.0)
        other = await client.pin("another-gateway", _prompt(1, 5))  # takes most of the cap
        assert other.tier == "device" and len(other.block_ids) == 5
        engine = await cluster_engine([host_tier_worker])
        await engine.start()
        try:
            ids = _prompt(7, 5)
            pin = await engine.pin("acme", "acme-salt", ids)
            assert pin.tiers(engine.healthy()) == {"h0": "host"} and pin.tier == "host"
            assert cluster_report(engine)["tenants"]["acme"]["pin_tiers"] == {"h0": "host"}
            info = _cache_info(engine, pin, len(ids))
            assert info["pin_tier"] == "host" and info["pin_tiers"] == {"h0": "host"}
            assert info["pinned_on"] == ["h0"]
            # the worker's KV events told the gateway where the pinned blocks live
            keys = [k.hex() for k in block_keys(root_key("acme-salt"), ids, BS, 0, 5)]
            async with asyncio.timeout(10):
                while not all(engine.index.tiers(k).get("h0", 0) & HOST for k in keys):
                    await asyncio.sleep(0.02)
            assert engine.index.longest("acme-salt", [*ids, 1], BS) == (5, frozenset({"h0"}))
            assert (await client.load()).stats.host_blocks_pinned == 5
            await engine.unpin(pin)  # the handle goes back with its tier: the host pin is freed
            assert (await client.load()).stats.host_blocks_pinned == 0
            engine.check_integrity()
        finally:
            await engine.shutdown()
        await client.unpin(other)
        assert (await client.load()).stats.blocks_pinned == 0
        await client.close()


def _cache_info(engine: Any, pin: Any, prefix_tokens: int) -> dict[str, Any]:
    """The admin cache view of a tenant whose prompt ``pin`` holds."""
    pins = PinManager(engine, tokenizer=None, store=None)  # type: ignore[arg-type]
    prefix = SimpleNamespace(ids=[0] * prefix_tokens)
    pins._current["acme"] = PromptEntry("acme", 1, "acme-salt", prefix, PINNED, pin)  # type: ignore[arg-type]
    return pins.cache_info("acme")
