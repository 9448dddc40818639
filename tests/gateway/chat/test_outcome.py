"""The outcome of a request is decided when its response is complete: a non-streaming answer
written in full and then closed by the client is a 200 with its tokens (metrics, log line,
span), and the TPM reservation is reconciled with the real usage."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp
import structlog

from gateway.context import TELEMETRY
from tests.gateway.harness import LiveGateway, live_gateway, make_settings, wait_for


def slow_release_spy(gw: LiveGateway, delay_s: float) -> list[int]:
    """Record the tokens each release reconciles, after ``delay_s`` (a slow limiter round
    trip), so the client's close lands while the handler is still giving things back."""
    limiter = gw.state.limiter
    original = limiter.release
    used: list[int] = []

    async def release(lease: Any, used_tokens: int) -> None:
        await asyncio.sleep(delay_s)
        used.append(used_tokens)
        await original(lease, used_tokens)

    limiter.release = release  # type: ignore[method-assign]
    return used


async def test_complete_response_then_client_close_is_a_200_with_tokens(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant("closer", limits={"max_output_tokens": 64})
        used = slow_release_spy(gw, 0.3)
        body = {
            "model": gw.state.model_name,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 6,
            "temperature": 0,
        }
        headers = {"Authorization": f"Bearer {t.key}"}
        with structlog.testing.capture_logs() as logs:
            async with aiohttp.ClientSession() as client:  # closed right after the read
                url = f"{gw.base_url}/v1/chat/completions"
                async with client.post(url, json=body, headers=headers) as resp:
                    assert resp.status == 200
                    usage = (await resp.json())["usage"]
            await wait_for(lambda: len(used) == 1, timeout=3.0)
            await wait_for(lambda: gw.state.drain.in_flight == 0, timeout=3.0)
        assert usage["completion_tokens"] == 6
        # Reconciled with the real usage (prompt + completion), not skipped or reserved-only.
        assert used == [usage["prompt_tokens"] + usage["completion_tokens"]]
        (line,) = [e for e in logs if e["event"] == "chat_request"]
        assert line["status"] == 200 and "error" not in line
        assert line["completion_tokens"] == 6
        assert line["prompt_tokens"] == usage["prompt_tokens"]
        (span,) = [s for s in gw.spans.get_finished_spans() if s.name.startswith("chat ")]
        assert span.attributes["http.response.status_code"] == 200
        assert span.attributes["gen_ai.usage.output_tokens"] == 6
        metrics = gw.app[TELEMETRY].metrics.render().decode()
        assert f'kvgate_requests_total{{status="200",tenant="{t.id}"}} 1.0' in metrics
        assert f'status="499",tenant="{t.id}"' not in metrics


async def test_client_gone_before_the_answer_is_a_499(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    """The other side of the rule: a client that leaves before the response is complete is
    recorded as a disconnect, with the tokens generated until then."""
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant("leaver", limits={"max_output_tokens": 1500})
        body = {
            "model": gw.state.model_name,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 1500,
            "temperature": 0,
        }
        headers = {"Authorization": f"Bearer {t.key}"}
        with structlog.testing.capture_logs() as logs:
            async with aiohttp.ClientSession() as client:
                url = f"{gw.base_url}/v1/chat/completions"
                with_timeout = aiohttp.ClientTimeout(total=0.5)
                with contextlib.suppress(TimeoutError):
                    await client.post(url, json=body, headers=headers, timeout=with_timeout)
            await wait_for(lambda: gw.state.drain.in_flight == 0, timeout=3.0)
        (line,) = [e for e in logs if e["event"] == "chat_request"]
        assert line["status"] == 499 and line["error"] == "client_disconnected"
        assert line["completion_tokens"] > 0  # the tokens the engine produced meanwhile
