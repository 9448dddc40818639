"""The re-warm policy of a vLLM replica (engine/remote/vllm_rewarm.py), on real asyncio: which
kept prompts are warmed again after the server's events say their blocks left, and when."""

from __future__ import annotations

import asyncio

import aiohttp

from engine.errors import EngineOverloaded
from engine.remote.vllm_client import VllmClient
from engine.remote.vllm_rewarm import Kept, Rewarmer
from gateway.cluster.vllm import VllmSource
from gateway.settings import Settings


class Server:
    """What the policy sees of a server: its kept prompts, its capacity, whether it is busy;
    ``warm`` records the re-warms and holds each one until ``release`` is set."""

    def __init__(self, capacity: int = 8) -> None:
        self.kept: dict[int, Kept] = {}
        self.capacity = capacity
        self.busy = False
        self.sent: list[int] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = asyncio.Event()
        self.release.set()
        self.fail = False

    async def warm(self, pin_id: int) -> None:
        self.sent.append(pin_id)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.release.wait()
            if self.fail:
                raise EngineOverloaded("full")
        finally:
            self.in_flight -= 1

    def rewarmer(self, recent_s: float = 30.0, clock: list[float] | None = None) -> Rewarmer:
        now = clock if clock is not None else [0.0]
        return Rewarmer(
            self.warm,
            lambda: self.busy,
            lambda: (self.kept, self.capacity),
            recent_s=recent_s,
            clock=lambda: now[0],
        )


async def test_a_recent_tenants_prompt_is_warmed_again() -> None:
    srv = Server()
    srv.kept = {1: Kept("a", 2), 2: Kept("b", 2)}
    rw = srv.rewarmer()
    rw.used("a")
    rw.used("b")
    rw.mark([1, 2])
    rw.kick()
    await rw.idle()
    assert srv.sent == [1, 2] and rw.done == 2 and rw.skipped == 0


async def test_a_tenant_without_recent_traffic_is_not_warmed_again() -> None:
    clock = [100.0]
    srv = Server()
    srv.kept = {1: Kept("cold", 1), 2: Kept("old", 1), 3: Kept("hot", 1)}
    rw = srv.rewarmer(recent_s=30.0, clock=clock)
    rw.used("old")
    clock[0] = 131.0  # "old" was 31 s ago
    rw.used("hot")
    rw.mark([1, 2, 3])
    rw.kick()
    await rw.idle()
    assert srv.sent == [3] and rw.skipped == 2


async def test_a_window_of_zero_never_warms_again() -> None:
    """``KVGATE_VLLM_REWARM_RECENT_S=0``: re-warms off, even for a request this instant."""
    srv = Server()
    srv.kept = {1: Kept("a", 1)}
    rw = srv.rewarmer(recent_s=0.0)
    rw.used("a")
    rw.mark([1])
    rw.kick()
    await rw.idle()
    assert srv.sent == [] and rw.done == 0 and rw.skipped == 1


async def test_one_rewarm_in_flight_at_a_time() -> None:
    srv = Server()
    srv.kept = {i: Kept(f"t{i}", 1) for i in range(4)}
    rw = srv.rewarmer()
    for i in range(4):
        rw.used(f"t{i}")
    srv.release.clear()
    rw.mark(range(4))
    rw.kick()
    rw.kick()  # a second kick while one runs starts nothing more
    await asyncio.sleep(0)
    assert srv.sent == [0] and srv.in_flight == 1
    srv.release.set()
    await rw.idle()
    assert srv.sent == [0, 1, 2, 3] and srv.most_in_flight == 1


async def test_nothing_is_sent_while_the_server_has_requests_in_flight() -> None:
    srv = Server()
    srv.kept = {1: Kept("a", 1), 2: Kept("b", 1)}
    rw = srv.rewarmer()
    rw.used("a")
    rw.used("b")
    srv.busy = True
    rw.mark([1])
    rw.kick()
    await rw.idle()
    assert srv.sent == []
    srv.busy = False  # the request ended: the client kicks again, the due one goes
    rw.kick()
    await rw.idle()
    assert srv.sent == [1]


async def test_a_request_arriving_stops_the_rest_of_the_queue() -> None:
    srv = Server()
    srv.kept = {1: Kept("a", 1), 2: Kept("b", 1)}
    rw = srv.rewarmer()
    rw.used("a")
    rw.used("b")
    srv.release.clear()
    rw.mark([1, 2])
    rw.kick()
    await asyncio.sleep(0)
    srv.busy = True  # a real request came while the first re-warm ran
    srv.release.set()
    await rw.idle()
    assert srv.sent == [1]  # the second waits for the server to be idle again
    srv.busy = False
    rw.kick()
    await rw.idle()
    assert srv.sent == [1, 2]


async def test_kept_prompts_that_cannot_fit_together_are_never_warmed_again() -> None:
    srv = Server(capacity=4)
    srv.kept = {1: Kept("a", 2), 2: Kept("b", 3)}  # 5 blocks kept, 4 in the cache: thrash
    rw = srv.rewarmer()
    rw.used("a")
    rw.used("b")
    rw.mark([1, 2])
    rw.kick()
    await rw.idle()
    assert srv.sent == [] and rw.skipped == 2
    del srv.kept[2]  # one unpinned: the rest fits again
    rw.mark([1])
    rw.kick()
    await rw.idle()
    assert srv.sent == [1]


async def test_an_unpinned_prompt_due_is_dropped_and_a_failure_does_not_stop_the_queue() -> None:
    srv = Server()
    srv.kept = {1: Kept("a", 1), 2: Kept("b", 1), 3: Kept("c", 1)}
    rw = srv.rewarmer()
    for ns in "abc":
        rw.used(ns)
    rw.mark([1, 2, 3, 1])  # marked twice: warmed once
    del srv.kept[2]
    srv.fail = True
    rw.kick()
    await rw.idle()
    assert srv.sent == [1, 3] and rw.done == 2


async def test_close_cancels_the_rewarm_in_flight() -> None:
    srv = Server()
    srv.kept = {1: Kept("a", 1), 2: Kept("b", 1)}
    rw = srv.rewarmer()
    rw.used("a")
    rw.used("b")
    srv.release.clear()
    rw.mark([1, 2])
    rw.kick()
    await asyncio.sleep(0)
    await rw.close()
    assert srv.sent == [1] and srv.in_flight == 0
    rw.kick()
    await rw.idle()
    assert srv.sent == [1]


async def test_the_setting_reaches_each_servers_rewarmer() -> None:
    """``KVGATE_VLLM_REWARM_RECENT_S`` through the vLLM source to every server's client."""
    for window, recent in (("0", False), ("30", True)):  # 0: none is recent enough
        env = {
            "KVGATE_BACKEND": "vllm",
            "KVGATE_WORKERS": "http://127.0.0.1:8001,http://127.0.0.1:8002",
            "KVGATE_VLLM_REWARM_RECENT_S": window,
        }
        source = VllmSource.from_settings(Settings.from_env(env), "/models/smol")
        async with aiohttp.ClientSession() as http:
            for url in source.endpoints:
                client = source.connect(url, http, 1.0)
                assert isinstance(client, VllmClient)
                client.rewarmer.used("a")
                assert client.rewarmer.recent("a") is recent
