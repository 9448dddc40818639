"""Cache scopes across the cluster: the worker protocol carries them, the KV-event index keys a
prompt in its end user's scope, so a returning visitor is routed to the worker holding its
conversation and another visitor sending the same tokens is not."""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec
import pytest

from engine.api import GenerateOptions
from engine.core.kv import CacheScope
from engine.core.kv.hashing import block_keys, root_key
from engine.params import SamplingParams
from engine.remote import messages as m
from engine.remote.client import WorkerClient
from engine.remote.messages import STORED, kv_events
from gateway.cluster.local import LocalWorker
from gateway.cluster.placement import WorkerSlot, hrw_order, place
from gateway.cluster.placer import TenantPin, placement_key
from tests.cluster.test_cluster import BLOCK, GREEDY, prompt, running
from tests.cluster.test_cold_tenants import _engine
from tests.cluster.test_worker_transport import raw_peer, recv_reply
from tests.cluster.workers import TOKEN

SYSTEM = prompt(70, 2)  # the tenant prefix: 2 blocks


def visitor(name: str, shared: int = len(SYSTEM)) -> CacheScope:
    return CacheScope(f"digest-of-{name}".encode(), shared)


def _generate_with_scope(scope: object) -> bytes:
    """A generate message whose options carry ``scope`` as given (not checked on this side)."""
    options = {"namespace": "n", "request_id": "s5", "cache_scope": scope}
    body = {"op": "generate", "call": 1, "token_ids": [5], "params": {}, "options": options}
    return msgspec.msgpack.encode(body)


def test_scope_travels_as_salt_bytes_and_shared_tokens() -> None:
    sc = visitor("a", 37)
    msg = m.Generate(1, [5], GREEDY, GenerateOptions("ns", "r", cache_scope=sc))
    assert m.decode_request(m.encode(msg)) == msg
    unscoped = m.Generate(1, [5], GREEDY, GenerateOptions("ns", "r"))
    assert m.decode_request(m.encode(unscoped)).options.cache_scope is None  # type: ignore[union-attr]
    for bad in ({"salt": "zz", "shared_tokens": 3}, {"salt": b"00", "shared_tokens": -1},
                {"salt": b"", "shared_tokens": 3}, {"salt": b"00"}):  # fmt: skip
        with pytest.raises(m.WireError, match="bad generate request"):
            m.decode_request(_generate_with_scope(bad))


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
    eng.index.apply(far, kv_events([[STORED, ns, k.hex(), None] for k in keys]))
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
        # a malformed scope is refused before any engine request is made
        async with await raw_peer(http, three_workers[2].url, TOKEN) as ws:
            await ws.send_bytes(_generate_with_scope({"salt": "not bytes", "shared_tokens": 3}))
            reply = await recv_reply(ws, 10)
        assert isinstance(reply, m.Failed)
        err = reply.error.rebuild()
        assert isinstance(err, ValueError) and "bad generate request" in str(err)
        await client.close()


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
