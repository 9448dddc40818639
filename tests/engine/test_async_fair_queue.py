"""Per-tenant shares of the engine's bounded waiting queue (AsyncEngine on the real runner)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator

import pytest

from engine import AsyncEngine
from engine.errors import EngineOverloaded, TenantQueueFull
from engine.outputs import RequestOutput
from tests.engine.test_async_engine import PROMPT, greedy, make_async


async def queue_up(
    aeng: AsyncEngine, tenant: str, count: int
) -> tuple[list[AsyncGenerator[RequestOutput, None]], list[asyncio.Task[RequestOutput]], int]:
    """Submit ``count`` requests of ``tenant``: (streams, their first-output tasks, refusals)."""
    gens, tasks, refused = [], [], 0
    for _ in range(count):
        gen = aeng.generate(PROMPT[:6], greedy(2), tenant=tenant)
        task = asyncio.create_task(gen.__anext__())
        await asyncio.sleep(0.02)  # the request reaches the engine's queue
        if task.done() and isinstance(task.exception(), EngineOverloaded):
            refused += 1
            continue
        gens.append(gen)
        tasks.append(task)
    return gens, tasks, refused


@pytest.mark.parametrize("policy", ["fair", "fcfs"])
async def test_a_flood_is_refused_alone_and_never_refuses_another_tenant(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_async(max_num_seqs=1, max_waiting=4, scheduling=policy) as aeng:
        first = aeng.generate(PROMPT, greedy(400), request_id="long", tenant="a")
        await first.__anext__()  # running now: everything else waits
        # The engine holds its next step until the queue is checked, so "long" is still
        # running however fast the host decodes; submissions the engine thread has not taken
        # yet count as waiting (AsyncEngine._reserve_waiting_slot).
        release, step = threading.Event(), aeng._core.step
        monkeypatch.setattr(aeng._core, "step", lambda: release.wait() and step())
        try:
            a_gens, a_tasks, a_refused = await queue_up(aeng, "a", 8)
            assert len(a_gens) == 4 and a_refused == 4  # a borrowed the whole idle queue
            b_gens, b_tasks, b_refused = await queue_up(aeng, "b", 3)
            if policy == "fcfs":
                assert b_refused == 3  # one global bound: a's flood is b's outage
            else:
                assert len(b_gens) == 2 and b_refused == 1  # b's share (4 * 1/2), then b alone
                with pytest.raises(TenantQueueFull) as info:
                    await aeng.generate(PROMPT[:5], greedy(2), tenant="a").__anext__()
                assert "share" in str(info.value)
        finally:
            release.set()
        await first.aclose()
        firsts = await asyncio.gather(*a_tasks, *b_tasks)
        assert all(o.new_token_ids for o in firsts)
        for g in (*a_gens, *b_gens):
            await g.aclose()
