"""Drain: tracked requests finish until the deadline minus the grace, the rest are cut with a
cancellation their handler can recognise (and still answer after); new requests get 503."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway.lifecycle.drain import Drain, grace_s
from tests.gateway.harness import live_gateway, make_settings, slow_engine_steps


async def test_run_waits_for_quick_requests_and_cuts_late_ones() -> None:
    drain = Drain()
    answered: dict[str, str] = {}

    async def request(name: str, seconds: float) -> None:
        with drain.track():
            try:
                await asyncio.sleep(seconds)
                answered[name] = "finished"
            except asyncio.CancelledError:
                if not drain.take_cut():
                    raise
                await asyncio.sleep(0.01)  # the handler may still write its last answer
                answered[name] = "cut"

    tasks = [asyncio.create_task(request("quick", 0.1)), asyncio.create_task(request("slow", 60))]
    await asyncio.sleep(0)
    assert drain.in_flight == 2
    drain.check_integrity()
    started = time.monotonic()
    assert await drain.run(1.0) == 1
    took = time.monotonic() - started
    assert 1.0 - grace_s(1.0) <= took < 1.0 + 0.2
    await asyncio.gather(*tasks)
    assert answered == {"quick": "finished", "slow": "cut"}
    assert drain.in_flight == 0
    drain.check_integrity()


async def test_other_cancellations_are_not_taken_for_the_cut() -> None:
    drain = Drain()
    seen: list[bool] = []

    async def request() -> None:
        with drain.track():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                seen.append(drain.take_cut())
                raise

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    task.cancel()  # the client went away
    await asyncio.gather(task, return_exceptions=True)
    assert seen == [False] and task.cancelled()
    assert await drain.run(1.0) == 0  # nothing in flight: returns at once


def test_grace_is_a_fifth_of_the_timeout_up_to_a_second() -> None:
    assert grace_s(10.0) == 1.0 and grace_s(1.0) == 0.2


async def test_new_requests_while_draining_get_503(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant("late")
        gw.state.draining = True
        body = {"model": gw.state.model_name, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {t.key}"}
        url = f"{gw.base_url}/v1/chat/completions"
        async with gw.http.post(url, json=body, headers=headers) as resp:
            assert resp.status == 503
            error = (await resp.json())["error"]
        assert error["code"] == "server_shutdown" and error["type"] == "service_unavailable"
        gw.state.draining = False


async def test_non_streaming_request_at_the_deadline_gets_503(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(gateway_database, tmp_path, KVGATE_SHUTDOWN_TIMEOUT_S="1")
    async with live_gateway(settings, demo_model_dir, shutdown_timeout=0.2) as gw:
        slow_engine_steps(gw, monkeypatch, 0.002)  # 1500 tokens: at least 3 s
        t = await gw.create_tenant("slow", limits={"max_output_tokens": 1500})
        body = {
            "model": gw.state.model_name,
            "messages": [{"role": "user", "content": "talk"}],
            "max_tokens": 1500,
            "temperature": 0,
        }
        headers = {"Authorization": f"Bearer {t.key}"}
        url = f"{gw.base_url}/v1/chat/completions"
        answer = asyncio.create_task(gw.http.post(url, json=body, headers=headers))
        await asyncio.sleep(0.3)  # generating
        await gw.shutdown()
        resp = await answer
        assert resp.status == 503
        error = (await resp.json())["error"]
        assert error["code"] == "server_shutdown"
        assert gw.state.limiter.active_leases(t.id) == 0
        (span,) = [s for s in gw.spans.get_finished_spans() if s.name.startswith("chat ")]
        assert span.attributes["http.response.status_code"] == 503
