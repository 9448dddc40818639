"""Client disconnects and graceful shutdown: engine requests and leases are always given back."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.context import TELEMETRY
from tests.gateway.harness import (
    LiveGateway,
    live_gateway,
    make_settings,
    slow_engine_steps,
    wait_for,
)


def stream_body(gw: LiveGateway, max_tokens: int) -> dict[str, Any]:
    return {
        "model": gw.state.model_name,
        "messages": [{"role": "user", "content": "talk"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }


async def test_disconnect_mid_stream_aborts_and_frees_blocks_and_lease(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant("dc", limits={"max_concurrency": 1, "max_output_tokens": 1500})
        client = gw.openai(t.key)
        stream = await client.chat.completions.create(**stream_body(gw, 1500))
        got = 0
        async for _chunk in stream:
            got += 1
            if got == 3:
                break
        assert gw.state.engine.cache_stats().blocks_in_use > 0
        assert gw.state.limiter.active_leases(t.id) == 1
        started = time.monotonic()
        await stream.close()  # the client goes away
        # 1500 tokens would take seconds; the abort frees everything at once.
        await wait_for(lambda: gw.state.engine.cache_stats().blocks_in_use == 0, timeout=2.0)
        await wait_for(lambda: gw.state.limiter.active_leases(t.id) == 0, timeout=2.0)
        gw.state.limiter.check_integrity()
        gw.state.pins.check_integrity()
        assert time.monotonic() - started < 2.0
        info = await gw.admin("GET", f"/tenants/{t.id}/cache")
        assert info["inflight_requests"] == 0
        resp = await client.chat.completions.create(**{**stream_body(gw, 2), "stream": False})
        assert resp.choices[0].finish_reason == "length"
        metrics = await (await gw.http.get(gw.metrics_url)).text()
        assert f'kvgate_requests_total{{status="499",tenant="{t.id}"}} 1.0' in metrics


async def read_stream(resp: aiohttp.ClientResponse) -> tuple[int, str | None, bool]:
    """(content chunks, finish reason, saw [DONE]) of an SSE response, until it ends."""
    chunks, finish, done = 0, None, False
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        data = json.loads(line[6:])
        if data["choices"] and data["choices"][0]["delta"].get("content"):
            chunks += 1
        if data["choices"] and data["choices"][0]["finish_reason"]:
            finish = data["choices"][0]["finish_reason"]
    return chunks, finish, done


async def test_graceful_shutdown_lets_streams_finish(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir, shutdown_timeout=10.0) as gw:
        t = await gw.create_tenant("drain", limits={"max_output_tokens": 200})
        url = f"{gw.base_url}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {t.key}"}
        async with gw.http.post(url, json=stream_body(gw, 120), headers=headers) as resp:
            first = await resp.content.readline()
            assert first.startswith(b"data: ")
            stopping = asyncio.create_task(gw.shutdown())
            await asyncio.sleep(0.05)
            with pytest.raises(aiohttp.ClientConnectionError):
                async with aiohttp.ClientSession() as fresh:
                    await fresh.get(f"{gw.base_url}/healthz")
            chunks, finish, done = await read_stream(resp)
        assert finish == "length" and done and chunks >= 100
        await stopping
        assert not gw.state.engine.is_running


async def test_shutdown_deadline_ends_long_streams_with_an_error_event(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream still running at the shutdown deadline gets a terminal error event and [DONE],
    is recorded as a shutdown (503), and the lease and blocks are given back."""
    settings = make_settings(gateway_database, tmp_path, KVGATE_SHUTDOWN_TIMEOUT_S="1")
    async with live_gateway(settings, demo_model_dir, shutdown_timeout=0.2) as gw:
        slow_engine_steps(gw, monkeypatch, 0.002)  # 1500 tokens: at least 3 s
        t = await gw.create_tenant("cut", limits={"max_output_tokens": 1500})
        url = f"{gw.base_url}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {t.key}"}
        async with gw.http.post(url, json=stream_body(gw, 1500), headers=headers) as resp:
            await resp.content.readline()
            started = time.monotonic()
            stopping = asyncio.create_task(gw.shutdown())
            events = [
                line.decode().strip() async for line in resp.content if line.startswith(b"data: ")
            ]
        await stopping
        # The deadline (1 s) plus a margin for a busy machine; the stream itself needs 3 s or more.
        assert time.monotonic() - started < 1.0 + 2.0
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][6:])["error"]
        assert error["code"] == "server_shutdown" and error["type"] == "service_unavailable"
        assert gw.state.limiter.active_leases(t.id) == 0
        assert gw.state.engine.cache_stats().blocks_in_use == 0
        gw.state.drain.check_integrity()
        assert gw.state.drain.in_flight == 0
        metrics = gw.app[TELEMETRY].metrics.render().decode()
        assert f'kvgate_requests_total{{status="503",tenant="{t.id}"}} 1.0' in metrics
        (span,) = [s for s in gw.spans.get_finished_spans() if s.name.startswith("chat ")]
        assert span.attributes["http.response.status_code"] == 503
        assert span.attributes["error.type"] == "server_shutdown"


async def test_engine_failure_mid_stream_becomes_an_error_event(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant("midfail", limits={"max_output_tokens": 1500})
        url = f"{gw.base_url}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {t.key}"}
        async with gw.http.post(url, json=stream_body(gw, 1500), headers=headers) as resp:
            assert resp.status == 200
            await resp.content.readline()
            await gw.state.engine.shutdown()  # the engine goes away under the stream
            events = [
                line.decode().strip() async for line in resp.content if line.startswith(b"data: ")
            ]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][6:])["error"]
        # The engine ends streams it cuts with RequestAborted (EngineClosed for new ones).
        assert error["code"] in ("request_aborted", "engine_unavailable")
        assert error["type"] == "service_unavailable"
        assert gw.state.limiter.active_leases(t.id) == 0
