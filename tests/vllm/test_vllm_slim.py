"""The vLLM backend on the slim install (``pip install kvgate``: docs/operations.md): ``kvgate
serve`` in a process where importing torch or Triton fails, in front of the session's two real
vLLM servers, serves a tenant's chat with its prompt prefix cached and a forced tool call."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from openai import AsyncOpenAI

from tests.e2e.servers import SlimServe
from tests.vllm.conftest import API_KEY, VllmPair
from tests.vllm.gateway import SYSTEM

ADMIN = "slim-vllm-admin-token-0123456789abcdef"
BLOCK = 128
USER = [{"role": "user", "content": "Is the library open on Sunday?"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "opening_hours",
        "parameters": {
            "type": "object",
            "properties": {"day": {"type": "string"}},
            "required": ["day"],
        },
    },
}


async def _tenant_key(url: str) -> str:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        body = {"id": "slim-lib", "name": "Library", "system_prompt": SYSTEM}
        async with http.post(f"{url}/admin/v1/tenants", json=body) as r:
            assert r.status == 201, await r.text()
        async with http.post(f"{url}/admin/v1/tenants/slim-lib/keys", json={"kind": "server"}) as r:
            assert r.status == 201, await r.text()
            key: str = (await r.json())["key"]
            return key


async def test_a_gateway_without_torch_serves_chat_from_vllm(
    vllm_pair: VllmPair, vllm_model: Path, tmp_path: Path
) -> None:
    servers = vllm_pair.servers
    env = {
        "KVGATE_BACKEND": "vllm",
        "KVGATE_WORKERS": ",".join(s.base_url for s in servers),
        "KVGATE_WORKER_TOKEN": API_KEY,
        "KVGATE_MODEL": str(vllm_model),
        "KVGATE_MODEL_NAME": "smol",
        "KVGATE_KV_EVENTS": ",".join(f"{s.kv_endpoint}|{s.replay_endpoint}" for s in servers),
        "KVGATE_ADMIN_TOKEN": ADMIN,
    }
    serve = SlimServe(tmp_path, env)
    serve.start()
    try:
        await serve.wait_ready(timeout=120)
        client = AsyncOpenAI(base_url=f"{serve.url}/v1", api_key=await _tenant_key(serve.url))
        try:
            first = await client.chat.completions.create(
                model="smol", messages=USER, max_tokens=8, temperature=0
            )
            again = await client.chat.completions.create(
                model="smol", messages=USER, max_tokens=8, temperature=0
            )
            forced = await client.chat.completions.create(
                model="smol",
                messages=USER,
                tools=[TOOL],
                tool_choice="required",
                parallel_tool_calls=False,  # one call: it ends well within max_tokens
                max_tokens=100,
                temperature=0,
            )
        finally:
            await client.close()
    finally:
        await serve.stop()
    assert first.choices[0].message.content and first.usage is not None
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens >= 2 * BLOCK  # the tenant prefix
    (call,) = forced.choices[0].message.tool_calls or []
    assert forced.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "opening_hours"
    assert isinstance(json.loads(call.function.arguments)["day"], str)
    assert "No module named" not in serve.read_output()
