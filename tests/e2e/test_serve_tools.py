"""``kvgate serve`` (its local worker process, the demo model) with tools and structured outputs:
the grammar reaches the worker, the SDK's ``parse`` and stream helpers work, every answer is in
OpenAI's schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import aiohttp
import openai
import pytest
from pydantic import BaseModel, Field

from tests.conformance.contract import ContractTransport, contract_client
from tests.e2e.servers import ServeProcess
from tests.e2e.test_serve import admin

ADMIN = "e2e-admin-token-0123456789"


class Ticket(BaseModel):
    priority: Literal["low", "high"]
    order_id: int = Field(ge=1, le=9999)


class Escalate(BaseModel):
    team: Literal["billing", "shipping"]


@pytest.mark.timeout(300)
async def test_serve_enforces_schemas_and_calls(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path, {"KVGATE_ADMIN_TOKEN": ADMIN})
    server.start()
    failures: list[str] = []
    try:
        await server.wait_ready()
        async with aiohttp.ClientSession() as http:
            limits = {"max_output_tokens": 200}
            body = {"id": "tools", "name": "Tools", "system_prompt": "Help.", "limits": limits}
            await admin(http, server.url, ADMIN, "/tenants", body)
            key = await admin(http, server.url, ADMIN, "/tenants/tools/keys", {"kind": "server"})
        client = contract_client(f"{server.url}/v1", key["key"], ContractTransport(failures))
        async with client:
            model = (await client.models.list()).data[0].id
            kw: dict[str, Any] = {
                "model": model,
                "messages": [{"role": "user", "content": "Order 12 is lost!"}],
                "max_tokens": 150,
                "seed": 3,
            }
            parsed = await client.chat.completions.parse(**kw, response_format=Ticket)
            assert isinstance(parsed.choices[0].message.parsed, Ticket)
            tool = openai.pydantic_function_tool(Escalate, name="escalate")
            one = {"tools": [tool], "tool_choice": "required", "parallel_tool_calls": False}
            async with client.chat.completions.stream(**kw, **one) as stream:
                final = await stream.get_final_completion()
            (call,) = final.choices[0].message.tool_calls or []
            assert isinstance(call.function.parsed_arguments, Escalate)
            assert final.choices[0].finish_reason == "tool_calls"
        assert failures == []
        assert await server.stop() == 0
    finally:
        if server.proc and server.proc.poll() is None:
            server.proc.kill()
