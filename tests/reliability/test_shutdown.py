"""SIGTERM on a real ``kvgate serve`` with long streams in flight.

With KVGATE_SHUTDOWN_TIMEOUT_S = T the process exits within T + 2 s; short streams finish
normally, streams still running at the deadline end with an error event (``server_shutdown``)
then ``[DONE]``: no stream is cut without a terminal event.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e.servers import ServeProcess
from tests.gateway.harness import ADMIN_TOKEN
from tests.tenants.fixtures import SECRETS_KEY

SHUTDOWN_TIMEOUT_S = 5.0
LONG_STREAMS = 4
SHORT_STREAMS = 2


async def admin(http: aiohttp.ClientSession, url: str, path: str, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with http.post(f"{url}/admin/v1{path}", json=body, headers=headers) as r:
        assert r.status == 201, await r.text()
        return await r.json()


async def stream(
    http: aiohttp.ClientSession, url: str, key: str, max_tokens: int, started: asyncio.Event
) -> list[str]:
    """The ``data:`` lines of one streamed chat, until the server ends the response."""
    body = {
        "model": "demo-model",
        "messages": [{"role": "user", "content": "talk"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    events: list[str] = []
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        try:
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    events.append(line)
                    started.set()
        except aiohttp.ClientPayloadError:
            events.append("cut")  # the connection closed before the response ended
    return events


def terminal(events: list[str]) -> str:
    """How a stream ended: "finished" (finish_reason, then [DONE]), "shutdown" (error event
    then [DONE]), or "cut" (no terminal event)."""
    if len(events) < 2 or events[-1] != "data: [DONE]":
        return "cut"
    last = json.loads(events[-2][6:])
    if "error" in last:
        assert last["error"]["code"] == "server_shutdown", last
        assert last["error"]["type"] == "service_unavailable"
        return "shutdown"
    finishes = [json.loads(e[6:])["choices"] for e in events[:-1]]
    assert any(c and c[0]["finish_reason"] for c in finishes), events[-3:]
    return "finished"


async def test_sigterm_with_long_streams_exits_in_time_and_ends_every_stream(
    gateway_database: str, tmp_path: Path
) -> None:
    proc = ServeProcess(
        tmp_path,
        {
            "KVGATE_DATABASE_URL": gateway_database,
            "KVGATE_SECRETS_KEY": SECRETS_KEY,  # PostgreSQL: the key is required
            "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "KVGATE_SHUTDOWN_TIMEOUT_S": str(SHUTDOWN_TIMEOUT_S),
            "KVGATE_MODEL_NAME": "demo-model",
            "KVGATE_KV_CACHE_BYTES": str(64 << 20),  # room for every long stream at once
        },
    )
    proc.start()
    try:
        await proc.wait_ready()
        async with aiohttp.ClientSession() as http:
            limits = {"max_output_tokens": 4000, "max_concurrency": 16}
            await admin(http, proc.url, "/tenants", {"id": "tt", "name": "t", "limits": limits})
            key = (await admin(http, proc.url, "/tenants/tt/keys", {"kind": "server"}))["key"]
            flags = [asyncio.Event() for _ in range(LONG_STREAMS + SHORT_STREAMS)]
            # The long ones take far longer than T on any machine; the short ones finish.
            lengths = [4000] * LONG_STREAMS + [3] * SHORT_STREAMS
            tasks = [
                asyncio.create_task(stream(http, proc.url, key, n, flag))
                for n, flag in zip(lengths, flags, strict=True)
            ]
            async with asyncio.timeout(30):
                for flag in flags:
                    await flag.wait()
            assert proc.proc is not None
            sent = time.monotonic()
            proc.proc.send_signal(signal.SIGTERM)
            results = await asyncio.gather(*tasks)
            code = await proc.stop(timeout=SHUTDOWN_TIMEOUT_S + 10)
            exited = time.monotonic() - sent
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.proc.kill()
    ends = [terminal(events) for events in results]
    assert exited <= SHUTDOWN_TIMEOUT_S + 2.0, (exited, proc.read_output()[-3000:])
    assert code == 0, proc.read_output()[-3000:]
    assert ends[LONG_STREAMS:] == ["finished"] * SHORT_STREAMS
    assert ends[:LONG_STREAMS] == ["shutdown"] * LONG_STREAMS, ends
