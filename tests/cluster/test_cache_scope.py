"""Cache scopes across the cluster: the worker protocol carries them, the KV-event index keys a
prompt in its end user's scope, so a returning visitor is routed to the worker holding its
conversation and another visitor sending the same tokens is not."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from engine.api import GenerateOptions
from engine.kv import CacheScope
from engine.kv.hashing import block_keys, root_key
from engine.params import SamplingParams
from engine.worker import wire
from engine.worker.events import STORED
from gateway.cluster.client import WorkerClient
from gateway.cluster.local import LocalWorker
from gateway.cluster.placement import WorkerSlot, hrw_order, place
from gateway.cluster.placer import TenantPin, placement_key
from tests.cluster.test_cluster import BLOCK, GREEDY, prompt, running
from tests.cluster.test_cold_tenants import _engine
from tests.cluster.workers import TOKEN

SYSTEM = prompt(70, 2)  # the tenant prefix: 2 blocks


def visitor(name: str, shared: int = len(SYSTEM)) -> CacheScope:
    return CacheScope(f"digest-of-{name}".encode(), shared)


def test_scope_travels_as_hex_salt_and_shared_tokens() -> None:
    sc = visitor("a", 37)
    data = wire.decode(wire.encode({"scope": wire.scope_to_wire(sc)}))
    assert wire.scope_from_wire(data["scope"]) == sc
    assert wire.scope_from_wire(None) is None
    for bad in (["zz", 3], ["00", -1], ["", 3], [1]):
        with pytest.raises((ValueError, TypeError)):
            wire.scope_from_wire(bad)


def test_affinity_follows_the_visitor_not_the_tokens() -> None:
    ns = "ns-scope"
    key = placement_key(ns)
    eng = _engine()
    near = hrw_order(key, ["w0", "w1"])[0]
    far = "w1" if near == "w0" else "w0"
    pin = TenantPin("t", ns, tuple(SYSTEM), BLOCK)
    pin.handles[near] = ("boot", None)  # type: ignore[assignment]
    eng.placer.pins[key] = pin
    eng.placer.placement = place([WorkerSlot("w0", 64), WorkerSlot("w1", 64)], [])
    eng.placer.placement.sets[key] = (near,)
    convo = [*SYSTEM, *range(500, 500 + 3 * BLOCK)]
    # visitor A's earlier turn is cached on the far worker (the worker's events: scoped keys)
    n = (len(convo) - 1) // BLOCK
    keys = block_keys(root_key(ns), convo, BLOCK, 0, n, visitor("a"))
    eng.index.apply(far, [[STORED, ns, k.hex(), None] for k in keys])
    follow = [*convo, 9, 9]
    route = eng._route(key, ns, follow, set(), visitor("a"))
    assert (route.member.worker_id, route.reason) == (far, "affinity")
    # B sends the same tokens: only the tenant prefix is B's too, so the placement decides
    for other in (visitor("b"), None):
        route = eng._route(key, ns, follow, set(), other)
        assert (route.member.worker_id, route.reason) == (near, "placement")


async def test_the_worker_api_keys_blocks_in_the_request_scope(
    three_workers: list[LocalWorker],
) -> None:
    convo = [*SYSTEM, *range(300, 300 + 3 * BLOCK)]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    async with aiohttp.ClientSession() as http:
        client = WorkerClient(three_workers[2].url, TOKEN, http)

        async def cached(rid: str, sc: CacheScope | None) -> int:
            outs = [
                o
                async for o in client.generate(
                    convo,
                    params,
                    GenerateOptions(namespace="ns-wire", request_id=rid, cache_scope=sc),
                )
            ]
            return outs[-1].num_cached_tokens

        assert await cached("s1", visitor("a")) == 0
        assert await cached("s2", visitor("b")) == len(SYSTEM)  # the shared blocks A computed
        assert await cached("s3", None) == len(SYSTEM)
        assert await cached("s4", visitor("a")) == (len(convo) - 1) // BLOCK * BLOCK
        # a malformed scope is refused with a 400 before any engine request is made
        body = {
            "ids": convo,
            "params": wire.params_to_wire(params),
            "ns": "n",
            "rid": "s5",
            "scope": ["not hex", 3],
        }
        url = three_workers[2].url + "/v1/generate"
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        async with http.post(url, data=wire.encode(body), headers=headers) as resp:
            assert resp.status == 400
            err = wire.error_from_wire((await resp.json())["e"])
        assert isinstance(err, ValueError) and "bad generate request" in str(err)


async def test_a_returning_visitor_is_routed_to_the_worker_holding_its_conversation(
    three_workers: list[LocalWorker],
) -> None:
    # any traffic makes the tenant hot enough for a replica on every worker
    async with running(three_workers, replica_rate=0.01, load_window_s=0.5) as eng:
        pin = await eng.pin("vis", "ns-vis", SYSTEM)
        async with asyncio.timeout(10):
            while len(eng.placer.placement.workers_of(pin.key)) < 3:
                outs = [
                    o
                    async for o in eng.generate(
                        [*SYSTEM, 1], GREEDY, GenerateOptions(namespace="ns-vis")
                    )
                ]
                assert outs[-1].finished
                await asyncio.sleep(0.2)

        async def turn(ids: list[int], sc: CacheScope) -> tuple[list[int], int, str]:
            before = {w: dict(m.routed) for w, m in eng.healthy().items()}
            outs = [
                o
                async for o in eng.generate(
                    ids, GREEDY, GenerateOptions(namespace="ns-vis", cache_scope=sc)
                )
            ]
            (wid,) = [w for w, m in eng.healthy().items() if dict(m.routed) != before[w]]
            routed = eng.healthy()[wid].routed
            (reason,) = [r for r in routed if routed[r] != before[wid].get(r, 0)]
            return list(outs[-1].token_ids), outs[-1].num_cached_tokens, f"{wid}:{reason}"

        convo = [*SYSTEM, *[100 + i for i in range(40)]]
        answer, _, first = await turn(convo, visitor("a"))
        holder = first.split(":")[0]
        await asyncio.sleep(0.3)  # KV events reach the index
        follow = [*convo, *answer, 7, 7, 7]
        for _ in range(2):  # the same worker every time, by affinity
            _, cached, where = await turn(follow, visitor("a"))
            assert where == f"{holder}:affinity" and cached >= len(convo) // BLOCK * BLOCK
        # B sends A's exact follow-up: the tenant prefix only, and no affinity to A's worker
        _, cached, where = await turn(follow, visitor("b"))
        assert cached <= len(SYSTEM) and not where.endswith(":affinity")
