"""The request log line names the key by its id (never the key) and the end user when given."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog

from tests.gateway.harness import live_gateway, make_settings


async def _log_line(logs: list[dict[str, Any]]) -> dict[str, Any]:
    for _ in range(200):  # the line is written after the response is sent
        lines = [e for e in logs if e["event"] == "chat_request"]
        if lines:
            (line,) = lines
            return line
        await asyncio.sleep(0.01)
    raise AssertionError("no chat_request log line")


async def test_log_line_has_key_id_and_end_user(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant("logs")
        (key,) = (await gw.admin("GET", f"/tenants/{t.id}/keys"))["data"]
        client = gw.openai(t.key)
        msgs = [{"role": "user", "content": "hi"}]
        model = gw.state.model_name
        with structlog.testing.capture_logs() as logs:
            await client.chat.completions.create(model=model, messages=msgs, max_tokens=2)
            line = await _log_line(logs)
        assert line["key_id"] == key["id"] and "end_user" not in line
        with structlog.testing.capture_logs() as logs:
            await client.chat.completions.create(
                model=model, messages=msgs, max_tokens=2, user="visitor-42"
            )
            line = await _log_line(logs)
        assert line["key_id"] == key["id"] and line["end_user"] == "visitor-42"
        assert t.key not in repr(logs)
