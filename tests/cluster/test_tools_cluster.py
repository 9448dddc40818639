"""Tools and structured outputs through a gateway in front of a worker process: the tokenizer the
gateway rebuilds from the worker's payload picks the same call format, the grammar travels to
the worker with the request, schemas the grammar engine cannot enforce are refused by the
gateway before the worker sees them, and the SDK's helpers work as against one process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
import pytest_asyncio
from pydantic import BaseModel, Field

from gateway.cluster.engine import ClusterEngine
from gateway.cluster.local import LocalWorker
from tests.cluster.workers import TOKEN, start_workers, stop_workers
from tests.gateway.harness import (
    LiveGateway,
    TenantHandle,
    create_database,
    drop_database,
    live_gateway,
    make_settings,
    pg_url,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


class Lookup(BaseModel):
    order_id: int = Field(ge=1, le=9999)
    channel: Literal["web", "phone"]


class Verdict(BaseModel):
    refund: bool
    reason: Literal["late", "damaged", "other"]


@pytest.fixture(scope="module")
def worker(demo_model_dir: Path) -> Iterator[LocalWorker]:
    workers = start_workers(demo_model_dir, ["t0"])
    yield workers[0]
    stop_workers(workers)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    worker: LocalWorker, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveGateway]:
    from tenants.migrate import upgrade_to_head

    name = await create_database()
    try:
        await upgrade_to_head(pg_url(name))
        var = tmp_path_factory.mktemp("tools-cluster")
        settings = make_settings(
            pg_url(name), var, KVGATE_WORKERS=worker.url, KVGATE_WORKER_TOKEN=TOKEN
        )
        async with live_gateway(settings, var / "no-model-needed") as live:
            yield live
    finally:
        await drop_database(name)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tenant(gw: LiveGateway) -> TenantHandle:
    limits = {"rpm": 10_000, "tpm": 10_000_000, "max_concurrency": 8, "max_output_tokens": 200}
    return await gw.create_tenant("tc", system_prompt="You are the order desk.", limits=limits)


def _args(gw: LiveGateway, **kw: Any) -> dict[str, Any]:
    msgs = [{"role": "user", "content": "Order 12 is late, can I get a refund?"}]
    return {"model": gw.state.model_name, "messages": msgs, "max_tokens": 160, "seed": 5, **kw}


async def test_calls_and_schemas_through_a_worker(gw: LiveGateway, tenant: TenantHandle) -> None:
    assert isinstance(gw.state.engine, ClusterEngine)
    client = gw.openai(tenant.key)
    tool = openai.pydantic_function_tool(Lookup, name="lookup")
    one: dict[str, Any] = {"tools": [tool], "tool_choice": "required", "parallel_tool_calls": False}
    done = await client.chat.completions.create(**_args(gw), **one)
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name == "lookup"
        Lookup.model_validate_json(call.function.arguments)
    parsed = await client.chat.completions.parse(**_args(gw), response_format=Verdict)
    assert isinstance(parsed.choices[0].message.parsed, Verdict)
    async with client.chat.completions.stream(**_args(gw, seed=6), **one) as stream:
        final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert calls and all(isinstance(c.function.parsed_arguments, Lookup) for c in calls)


async def test_unenforceable_schemas_are_refused_by_the_gateway(
    gw: LiveGateway, tenant: TenantHandle
) -> None:
    client = gw.openai(tenant.key)
    schema = {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}
    rf = {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(**_args(gw), response_format=rf)
    body: Any = info.value.body
    assert body["param"] == "response_format.json_schema.schema" and "not" in body["message"]
