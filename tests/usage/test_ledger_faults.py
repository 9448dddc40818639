"""Nothing lost, nothing twice: a SIGKILL of ``kvgate serve`` mid-load then a restart (the
spool is replayed), and a database blackout during load behind a TCP fault proxy (the records
wait in the spool and land when it is back). In both, the ledger's answered totals equal the
``usage`` objects the clients received, and every request id is recorded once."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import openai
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.usage.ledger import LEDGER
from tenants.db import make_engine
from tests.e2e.servers import ServeProcess
from tests.gateway.harness import ADMIN_TOKEN, live_gateway, make_settings
from tests.reliability._proxy import fault_proxy
from tests.tenants.fixtures import SECRETS_KEY
from tests.usage.helpers import Seen, ledger_totals, wait_records

WORKERS = 4


async def _load(client: openai.AsyncOpenAI, model: str, seen: Seen, stop: asyncio.Event) -> None:
    """Requests back to back until ``stop``; a failed one (the server died, or refused while a
    fault lasted) is simply not counted."""
    i = 0
    while not stop.is_set():
        i += 1
        try:
            if i % 2:
                resp = await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"hi {i}"}],
                    max_tokens=3,
                    n=1 + i % 3,
                )
                seen.add(resp.usage)
            else:
                stream = await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"hey {i}"}],
                    max_tokens=4,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                usage = [c.usage async for c in stream if c.usage is not None]
                if usage:
                    seen.add(usage[-1])
        except (openai.APIError, openai.APIConnectionError):
            await asyncio.sleep(0.05)


async def _admin_key(http_url: str) -> str:
    import aiohttp

    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        body = {"id": "kill", "name": "k", "limits": {"rpm": 100000, "max_concurrency": 64}}
        async with http.post(f"{http_url}/admin/v1/tenants", json=body) as r:
            assert r.status == 201, await r.text()
        async with http.post(
            f"{http_url}/admin/v1/tenants/kill/keys", json={"kind": "server"}
        ) as r:
            return str((await r.json())["key"])


BATCH = 7


async def _one(client: openai.AsyncOpenAI, seen: Seen) -> None:
    resp = await client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "one"}], max_tokens=2
    )
    seen.add(resp.usage)


async def _leave_a_partial_batch(
    client: openai.AsyncOpenAI, engine: AsyncEngine, seen: Seen
) -> None:
    """With no request in flight, bring the recorder to a state where some records have landed
    and 1 to ``BATCH - 2`` wait in the spool only, with no flush to come (the interval is an
    hour). A flush takes every pending record and starts only at ``BATCH`` of them, so while one
    runs at least ``BATCH`` records are missing from the database: a gap below that means no
    flush is running and none will start until ``BATCH - gap`` more requests are answered."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        gap = seen.requests - (await ledger_totals(engine, "kill"))[0]
        if 0 < gap <= BATCH - 2:
            return
        if gap == 0 or gap == BATCH - 1:
            await _one(client, seen)  # 0 -> 1 pending; 6 -> 7 starts a flush that drains all
        else:
            await asyncio.sleep(0.05)  # a flush is landing
    raise AssertionError(f"the ledger did not settle: {seen}")


async def _kill_mid_stream(first: ServeProcess, client: openai.AsyncOpenAI, seen: Seen) -> None:
    """SIGKILL while a streamed answer is being decoded (its record is never written)."""
    stream = await client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "a long one"}],
        max_tokens=200,
        stream=True,
        stream_options={"include_usage": True},
    )
    try:
        async for chunk in stream:
            if chunk.usage is not None:
                seen.add(chunk.usage)  # finished before the kill: counted like any other
            assert first.proc is not None
            if first.proc.poll() is None:
                first.proc.send_signal(signal.SIGKILL)
                first.proc.wait()
    except (openai.APIError, openai.APIConnectionError):
        pass


async def test_sigkill_mid_load_then_restart_loses_nothing_delivered(
    gateway_database: str, tmp_path: Path
) -> None:
    env = {
        "KVGATE_DATABASE_URL": gateway_database,
        "KVGATE_SECRETS_KEY": SECRETS_KEY,  # PostgreSQL: the key is required
        "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "KVGATE_MODEL_NAME": "demo",
        "KVGATE_USAGE_SPOOL_DIR": str(tmp_path / "spool"),
        # Batches land at BATCH records; the flush interval is far away, so the kill leaves
        # records both in the database and only in the spool.
        "KVGATE_USAGE_BATCH": str(BATCH),
        "KVGATE_USAGE_FLUSH_S": "3600",
    }
    first = ServeProcess(tmp_path, env)
    first.start()
    seen = Seen()
    engine = make_engine(gateway_database)
    try:
        await first.wait_ready()
        key = await _admin_key(first.url)
        client = openai.AsyncOpenAI(base_url=f"{first.url}/v1", api_key=key, max_retries=0)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_load(client, "demo", seen, stop)) for _ in range(WORKERS)]
        while seen.requests < 30:
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*tasks)
        await _leave_a_partial_batch(client, engine, seen)
        before = await ledger_totals(engine, "kill")
        assert before == await ledger_totals(engine, "kill", "AND outcome = 'answered'")
        assert 0 < before[0] < seen.requests  # some records landed, some are in the spool only
        await _kill_mid_stream(first, client, seen)
        await client.close()
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.proc.kill()
    try:
        second = ServeProcess(tmp_path, {**env, "KVGATE_USAGE_FLUSH_S": "0.05"})
        second.start()
        try:
            await second.wait_ready()
            totals = await wait_records(gateway_database, "kill", seen.requests, timeout=30)
        finally:
            await second.stop()
        answered = await ledger_totals(engine, "kill", "AND outcome = 'answered'")
    finally:
        await engine.dispose()
    assert totals[0] == totals[4], totals  # no request id twice
    assert answered[0] == seen.requests, (answered, seen)
    assert answered[1:4] == seen.tokens(), (answered, seen)


async def test_database_blackout_during_load_records_land_after(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with fault_proxy() as proxy:
        url = gateway_database.replace(":5432/", f":{proxy.port}/")
        settings = make_settings(
            url,
            tmp_path,
            KVGATE_MODEL_NAME="demo",
            KVGATE_DB_TIMEOUT_S="1",
            KVGATE_DB_RETRY_S="0.3",
            KVGATE_USAGE_DB_TIMEOUT_S="1",
            KVGATE_USAGE_FLUSH_S="0.05",
            KVGATE_KEY_CACHE_TTL_S="0.2",
        )
        async with live_gateway(settings, demo_model_dir) as gw:
            tenant = await gw.create_tenant("blackout", limits={"rpm": 100000})
            client = gw.openai(tenant.key)
            seen = Seen()
            stop = asyncio.Event()
            tasks = [asyncio.create_task(_load(client, "demo", seen, stop)) for _ in range(3)]
            while seen.requests < 10:
                await asyncio.sleep(0.05)
            await proxy.blackhole()  # stalls: every statement waits out its deadline
            during = seen.requests
            await asyncio.sleep(3)
            await proxy.refuse()  # then refused outright
            await asyncio.sleep(1.5)
            served_blind = seen.requests - during
            ledger = gw.app[LEDGER]
            assert ledger.recorder.backlog > 0  # records wait in the spool only
            await proxy.restore()
            await asyncio.sleep(1)
            stop.set()
            await asyncio.gather(*tasks)
            totals = await wait_records(gateway_database, tenant.id, seen.requests, timeout=30)
            assert ledger.recorder.backlog == 0
        engine = make_engine(gateway_database)
        try:
            answered = await ledger_totals(engine, tenant.id, "AND outcome = 'answered'")
        finally:
            await engine.dispose()
    assert served_blind > 0  # chats went on (last-known-good keys) while the database was away
    assert totals[0] == totals[4], totals
    assert answered[0] == seen.requests, (answered, seen)
    assert answered[1:4] == seen.tokens()
