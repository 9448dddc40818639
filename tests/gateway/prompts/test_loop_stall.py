"""Huge prompts never stall the event loop: with 8 requests of a 1 MB message in flight,
``/healthz`` answers within 100 ms (p99), the loop never lags much, and another tenant's chat
takes at most about twice its unloaded time.

The model is the demo model with a 128k-token context, so a 1 MB message passes the character
bound and is really rendered and tokenized (then refused: it is ~500k tokens). Everything runs on
this test's event loop, the gateway's too, so a ticker on it measures the gateway's loop lag.
Limits are relative to the same measurements unloaded, made here first (100 ms plus three times
the unloaded p99 for /healthz and the loop lag; twice the unloaded chat time plus 100 ms), so a
slow or busy machine does not fail the test; a loop that tokenizes on itself lags by whole
seconds (~1 µs per character). The figures are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import statistics
import time
from collections import Counter
from pathlib import Path

from tests.gateway.harness import LiveGateway, live_gateway, make_settings
from tests.gateway.loadprobe import LoopLag, p99, running

HOSTILE_IN_FLIGHT = 8
MESSAGE_CHARS = 1_000_000  # a 1 MB message in a body under KVGATE_MAX_BODY_BYTES (1 MiB)
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "please"]
WINDOW_S = 3.0  # how long /healthz and the ticker are measured, unloaded and then loaded


def hostile_body(model: str) -> bytes:
    rng = random.Random(5)
    text = " ".join(rng.choice(WORDS) for _ in range(MESSAGE_CHARS // 4))[:MESSAGE_CHARS]
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    return gzip.compress(json.dumps(body).encode(), 6)


async def hostile_client(gw: LiveGateway, key: str, body: bytes, statuses: Counter[str]) -> None:
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
    }
    url = f"{gw.base_url}/v1/chat/completions"
    while True:
        async with gw.http.post(url, data=body, headers=headers) as r:
            error = (await r.json()).get("error") or {}
            statuses[f"{r.status} {error.get('code')}"] += 1
            if r.status == 429:  # the pool's share is full: retry as told, like any client
                await asyncio.sleep(float(r.headers.get("Retry-After", "1")))


async def healthz_times(gw: LiveGateway, seconds: float) -> list[float]:
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        async with gw.http.get(f"{gw.base_url}/healthz") as r:
            assert r.status == 200
            await r.read()
        out.append(time.perf_counter() - start)
        await asyncio.sleep(0.01)
    return out


async def chat_times(gw: LiveGateway, key: str, count: int) -> list[float]:
    client = gw.openai(key)
    out = []
    for i in range(count):
        start = time.perf_counter()
        await client.chat.completions.create(
            model=gw.state.model_name,
            messages=[{"role": "user", "content": f"hello, question {i}"}],
            max_tokens=4,
            temperature=0.0,
        )
        out.append(time.perf_counter() - start)
    return out


async def measure(gw: LiveGateway, key: str) -> tuple[list[float], list[float], float]:
    """(/healthz times, loop lags) over WINDOW_S, and the median time of another chat."""
    lag = LoopLag()
    async with running(lag.run()):
        health, chats = await asyncio.gather(healthz_times(gw, WINDOW_S), chat_times(gw, key, 7))
    return health, lag.lags, statistics.median(chats)


async def test_huge_prompts_in_flight_leave_the_loop_responsive(
    gateway_database: str, long_context_model: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, long_context_model) as gw:
        hostile = await gw.create_tenant("hostile")
        other = await gw.create_tenant("other")
        body = hostile_body(gw.state.model_name)
        await chat_times(gw, other.key, 2)  # warm-up
        base_health, base_lags, unloaded = await measure(gw, other.key)
        statuses: Counter[str] = Counter()
        clients = [
            hostile_client(gw, hostile.key, body, statuses) for _ in range(HOSTILE_IN_FLIGHT)
        ]
        async with running(asyncio.gather(*clients)), asyncio.timeout(120):
            while not statuses["400 context_length_exceeded"]:  # hostile prompts tokenized
                await asyncio.sleep(0.05)
            health, lags, loaded = await measure(gw, other.key)
        print(  # the figures, with -s
            f"\nhostile answers {dict(statuses)}; /healthz p99 {p99(health) * 1e3:.1f} ms "
            f"(unloaded {p99(base_health) * 1e3:.1f}); loop lag p99 {p99(lags) * 1e3:.1f} ms, "
            f"max {max(lags) * 1e3:.1f} (unloaded {p99(base_lags) * 1e3:.1f}, "
            f"{max(base_lags) * 1e3:.1f}); other tenant's chat {unloaded * 1e3:.0f} ms unloaded, "
            f"{loaded * 1e3:.0f} ms loaded ({loaded / unloaded:.2f}x)"
        )
        # The hostile prompts were really tokenized, and refused for their length.
        assert set(statuses) <= {"400 context_length_exceeded", "429 rate_limit_exceeded"}
        assert p99(health) < 0.100 + 3 * p99(base_health), "/healthz p99"
        assert p99(lags) < 0.100 + 3 * p99(base_lags), "loop lag p99"
        assert loaded <= 2 * unloaded + 0.100, (loaded, unloaded)
        gw.state.prompts.check_integrity()
