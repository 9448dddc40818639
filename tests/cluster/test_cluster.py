"""A cluster engine over three worker processes: pin budgets, affinity, agreement, gateway."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.api import GenerateOptions
from engine.params import SamplingParams
from gateway.cluster.engine import ClusterEngine
from gateway.cluster.local import LocalWorker
from tests.cluster.workers import cluster_engine

BLOCK = 16
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def prompt(tenant: int, blocks: int) -> list[int]:
    return [(tenant * 131 + i * 7) % 1500 + 3 for i in range(blocks * BLOCK)]


@contextlib.asynccontextmanager
async def running(workers: list[LocalWorker], **kwargs: object) -> AsyncIterator[ClusterEngine]:
    eng = await cluster_engine(workers, **kwargs)
    await eng.start()
    try:
        yield eng
    finally:
        for pin in list(eng.placer.pins.values()):
            await eng.unpin(pin)
        await eng.shutdown()


async def generate(eng: ClusterEngine, ids: list[int], ns: str) -> tuple[list[int], int]:
    outs = [out async for out in eng.generate(ids, GREEDY, GenerateOptions(namespace=ns))]
    out = outs[-1]
    assert out.finished
    return list(out.token_ids), out.num_cached_tokens


async def test_pins_fill_workers_within_their_budgets(three_workers: list[LocalWorker]) -> None:
    async with running(three_workers) as eng, running(three_workers) as other:
        # 9 tenants x 12 blocks = 108 blocks: more than one worker's pin budget (64)
        pins = [await eng.pin(f"t{i}", f"ns-budget-{i}", prompt(i, 12)) for i in range(9)]
        budget = {wid: m.info.pin_budget_blocks for wid, m in eng.healthy().items()}
        used: dict[str, int] = {}
        for pin in pins:
            assert pin.workers(eng.healthy()) == sorted(eng.placer.placement.workers_of(pin.key))
            for wid in pin.workers(eng.healthy()):
                used[wid] = used.get(wid, 0) + pin.blocks
        assert len(used) >= 2 and all(used[w] <= budget[w] for w in used)
        eng.placer.check_integrity()
        await asyncio.sleep(0.5)  # a load poll after the pins
        await eng._check_all()
        for wid, m in eng.healthy().items():
            assert m.load is not None and m.load.stats.blocks_pinned == used.get(wid, 0)
        # a second gateway with the same tenants computes the same placement
        for i in range(9):
            other.placer.pins[pins[i].key] = type(pins[i])(
                f"t{i}", f"ns-budget-{i}", tuple(prompt(i, 12)), BLOCK
            )
        assert other.placer.plan(other.healthy(), {}).sets == eng.placer.placement.sets
        other.placer.pins.clear()
        # requests of a pinned tenant find the whole prompt cached
        _, cached = await generate(eng, [*prompt(3, 12), 9, 9, 9], "ns-budget-3")
        assert cached == 12 * BLOCK


async def test_follow_up_turns_go_to_the_worker_holding_the_conversation(
    three_workers: list[LocalWorker],
) -> None:
    # any traffic makes the tenant hot enough for a replica on every worker; the spill
    # threshold is out of the way: on a busy host a worker's queue delay can pass 0.5 s, and
    # spilling is not what this test is about
    async with running(
        three_workers, replica_rate=0.01, load_window_s=0.5, spill_queue_s=60
    ) as eng:
        pin = await eng.pin("aff", "ns-aff", prompt(50, 2))
        async with asyncio.timeout(30):  # placed on all three, and pinned there (a pin moves
            while len(pin.handles) < 3:  # after its placement: until then its holders serve)
                await generate(eng, [*prompt(50, 2), 1], "ns-aff")
                await asyncio.sleep(0.2)
        for m in eng.members.values():
            m.routed.clear()
        convs = [prompt(50, 2) + [100 + c] * 40 for c in range(3)]
        # first turns at the same time: least-loaded routing spreads them over the workers
        firsts = await asyncio.gather(*(generate(eng, ids, "ns-aff") for ids in convs))
        served = {wid: dict(m.routed) for wid, m in eng.healthy().items()}
        assert sum(1 for r in served.values() if r) == 3, served
        async with asyncio.timeout(30):  # each worker's KV events reach the index
            while any(eng.index.longest("ns-aff", ids, BLOCK)[0] <= 2 for ids in convs):
                await asyncio.sleep(0.05)
        for ids, (answer, _) in zip(convs, firsts, strict=True):
            before = {wid: m.routed["affinity"] for wid, m in eng.healthy().items()}
            follow = ids + answer + [7] * 20
            _, cached = await generate(eng, follow, "ns-aff")
            assert cached >= (len(ids) // BLOCK) * BLOCK  # its earlier turn was reused
            after = {wid: m.routed["affinity"] for wid, m in eng.healthy().items()}
            assert sum(after.values()) == sum(before.values()) + 1


@pytest.mark.usefixtures("three_workers")
async def test_gateway_over_workers_serves_chat_and_reports_the_cluster(
    three_workers: list[LocalWorker], tmp_path: Path
) -> None:
    from gateway.context import TELEMETRY
    from tests.cluster.workers import TOKEN
    from tests.gateway.harness import (
        create_database,
        drop_database,
        live_gateway,
        make_settings,
        pg_url,
    )

    name = await create_database()
    try:
        from tenants.migrate import upgrade_to_head

        await upgrade_to_head(pg_url(name))
        settings = make_settings(
            pg_url(name),
            tmp_path,
            KVGATE_WORKERS=",".join(w.url for w in three_workers),
            KVGATE_WORKER_TOKEN=TOKEN,
            KVGATE_WORKER_HEALTH_S="0.3",
        )
        async with live_gateway(settings, tmp_path / "no-model-needed") as gw:
            text = "You are a helpful assistant for kvgate. " * 6
            tenant = await gw.create_tenant("cl", system_prompt=text)
            info = await gw.wait_pinned(tenant.id)
            assert info["pin_state"] == "pinned" and len(info["pinned_on"]) == 1
            client = gw.openai(tenant.key)
            msgs = [{"role": "user", "content": "hello"}]
            resp = await client.chat.completions.create(model=gw.state.model_name, messages=msgs)
            assert resp.usage.prompt_tokens_details.cached_tokens >= info["pinned_tokens"] > 0
            report = await gw.admin("GET", "/cluster")
            assert report["mode"] == "cluster" and len(report["workers"]) == 3
            holder = info["pinned_on"][0]
            worker = next(w for w in report["workers"] if w["worker_id"] == holder)
            assert tenant.id in worker["pinned_tenants"] and worker["healthy"]
            body = gw.app[TELEMETRY].metrics.render().decode()
            assert f'kvgate_worker_up{{worker="{holder}"}} 1.0' in body
            assert "kvgate_worker_routed_requests_total" in body
    finally:
        await drop_database(name)
