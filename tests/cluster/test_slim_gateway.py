"""The gateway without torch (``pip install kvgate``, docs/operations.md): ``kvgate serve`` in a
process where importing torch or Triton fails serves chat through an engine worker, and without
``KVGATE_WORKERS`` says in one line which extra it lacks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from gateway.cluster.local import ENGINE_EXTRA, LocalWorker
from tests.cluster.workers import TOKEN, start_workers, stop_workers
from tests.e2e.servers import SlimServe

ADMIN = "slim-admin-token-0123456789abcdef"


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalWorker]:
    from engine.runtime.model.demo import write_demo_model

    (w,) = start_workers(write_demo_model(tmp_path_factory.mktemp("slim-model")), ["slim"])
    yield w
    stop_workers([w])


async def test_a_gateway_without_torch_serves_chat_through_a_worker(
    worker: LocalWorker, tmp_path: Path
) -> None:
    env = {
        "KVGATE_WORKERS": worker.url,
        "KVGATE_WORKER_TOKEN": TOKEN,
        "KVGATE_ADMIN_TOKEN": ADMIN,
        "KVGATE_MODEL_NAME": "demo",
    }
    serve = SlimServe(tmp_path, env)
    serve.start()
    try:
        await serve.wait_ready()
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            body = {"id": "slim", "name": "Slim", "system_prompt": "You help."}
            async with http.post(f"{serve.url}/admin/v1/tenants", json=body) as r:
                assert r.status == 201, await r.text()
            keys = f"{serve.url}/admin/v1/tenants/slim/keys"
            async with http.post(keys, json={"kind": "server"}) as r:
                assert r.status == 201, await r.text()
                key = (await r.json())["key"]
        client = AsyncOpenAI(base_url=f"{serve.url}/v1", api_key=key)
        try:
            done = await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        finally:
            await client.close()
        assert done.choices[0].message.content and done.usage is not None
        assert done.usage.completion_tokens >= 1
    finally:
        await serve.stop()
    assert "No module named" not in serve.read_output()


def test_without_workers_it_names_the_missing_extra(tmp_path: Path) -> None:
    serve = SlimServe(tmp_path, {"KVGATE_ADMIN_TOKEN": ADMIN})
    serve.start()
    assert serve.proc is not None
    assert serve.proc.wait(timeout=60) == 2
    lines = [ln for ln in serve.read_output().splitlines() if ln.strip()]
    assert lines[-1] == (
        f"kvgate serve: KVGATE_WORKERS is unset and the engine is not installed: "
        f"pip install '{ENGINE_EXTRA}'"
    ), lines
    assert "Traceback" not in serve.read_output()
