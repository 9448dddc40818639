"""Structured-output traffic through the tokenize pool, end to end with the official client.

* Ten concurrent ``chat.completions.parse`` calls of one tenant with one pydantic schema are all
  answered: the schema is compiled once (the requests wait for that one job, within the tenant's
  concurrency limit), never refused because each counted as large work.
* A tenant sending four distinct 500 KB schemas does not hold another tenant's 6 KB prompt: its
  compiles run one at a time on one thread (a compile cannot be pre-empted), the other tenant's
  prompt takes the other thread at once. The bound does not depend on the machine's speed: the
  other tenant is answered before the first of the four compiles ends (it waits for none of
  them); a compile of such a schema is over a second of CPU, the prompt some milliseconds
  of tokenizing on a thread of the same priority and one short engine step. The figures are
  printed (``-s``).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import pytest
import pytest_asyncio
from pydantic import BaseModel, Field

from engine.constraints.compiler import compiler_for
from tests.gateway.harness import (
    LiveGateway,
    create_database,
    drop_database,
    live_gateway,
    make_settings,
    pg_url,
    wait_for,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMITS = {"rpm": 10_000, "tpm": 100_000_000, "max_concurrency": 16, "max_output_tokens": 400}
SCHEMA_BYTES = 500_000
PROMPT_CHARS = 6_000  # over the pool's inline bound: tokenized on a thread


class ParcelStatus(BaseModel):
    tracking_id: str = Field(max_length=8)
    where: Literal["depot", "van", "doorstep", "lost"]
    days_late: int = Field(ge=0, le=30)
    signed: bool


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    template_database: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveGateway]:
    name = await create_database(template_database)
    var_dir = tmp_path_factory.mktemp("pool-traffic")
    # room in the KV cache for the 6 KB prompt (~2,700 demo-model tokens)
    settings = make_settings(pg_url(name), var_dir, KVGATE_KV_CACHE_BYTES=str(64 << 20))
    try:
        async with live_gateway(settings, demo_model_dir) as live:
            yield live
    finally:
        await drop_database(name)


def compiles(gw: LiveGateway) -> int:
    """Grammars compiled so far (the gateway's check and the engine share the cache)."""
    return compiler_for(gw.state.tokenizer).stats().misses


async def test_ten_concurrent_parse_calls_of_one_schema_are_all_answered(gw: LiveGateway) -> None:
    tenant = await gw.create_tenant("burst", limits=LIMITS)
    client = gw.openai(tenant.key)  # no retries: a 429 would surface
    before = compiles(gw)
    ask = [{"role": "user", "content": "Where is my order 4711?"}]
    answers = await asyncio.gather(
        *(
            client.chat.completions.parse(
                model=gw.state.model_name,
                messages=ask,
                max_tokens=300,
                seed=seed,
                temperature=1.0,
                response_format=ParcelStatus,
            )
            for seed in range(10)
        ),
        return_exceptions=True,
    )
    failed = [a for a in answers if isinstance(a, BaseException)]
    assert not failed, failed
    for done in answers:
        assert not isinstance(done, BaseException)
        assert isinstance(done.choices[0].message.parsed, ParcelStatus)
    assert compiles(gw) == before + 1  # one compile for the ten requests
    gw.state.prompts.check_integrity()


def large_schema(seed: int) -> dict[str, Any]:
    """A distinct JSON schema of about SCHEMA_BYTES: many string properties."""
    props: dict[str, Any] = {}
    size = 0
    while size < SCHEMA_BYTES:
        prop = {"type": "string", "maxLength": 20, "description": f"field {seed} " + "x" * 40}
        props[f"f{seed}_{len(props)}"] = prop
        size += len(json.dumps(prop)) + 16
    return {"type": "object", "properties": props, "required": list(props)[:3]}


async def test_a_tenants_compiles_never_hold_another_tenants_prompt(gw: LiveGateway) -> None:
    heavy = await gw.create_tenant("schemas", limits=LIMITS)
    light = await gw.create_tenant("prompt", limits=LIMITS)
    heavy_client, light_client = gw.openai(heavy.key), gw.openai(light.key)
    model = gw.state.model_name
    text = ("please tell me where my parcel is, it was due last week " * 200)[:PROMPT_CHARS]

    async def light_chat() -> float:
        start = time.perf_counter()
        done = await light_client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}], max_tokens=4
        )
        assert done.choices[0].finish_reason in ("stop", "length")
        return time.perf_counter() - start

    unloaded = statistics.median([await light_chat() for _ in range(3)])

    async def heavy_chat(seed: int) -> None:
        schema = {"name": f"s{seed}", "schema": large_schema(seed)}
        await heavy_client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "fill it in"}],
            max_tokens=2,
            response_format={"type": "json_schema", "json_schema": schema},
        )

    before = compiles(gw)
    schemas = [asyncio.create_task(heavy_chat(seed)) for seed in range(4)]
    await wait_for(lambda: heavy.id in gw.state.prompts.load(), timeout=60)
    await wait_for(lambda: gw.state.prompts.load()[heavy.id].running > 0, timeout=60)
    loaded = await light_chat()
    compiled_meanwhile = compiles(gw) - before
    load = gw.state.prompts.load().get(heavy.id)
    print(  # the figures, with -s
        f"\nanother tenant's {PROMPT_CHARS}-character prompt: {unloaded * 1e3:.0f} ms alone, "
        f"{loaded * 1e3:.0f} ms while 4 schemas of {SCHEMA_BYTES // 1000} KB compile "
        f"({compiled_meanwhile} of them done by then; pool: {load})"
    )
    assert compiled_meanwhile == 0, "the other tenant waited for a compile"
    async with asyncio.timeout(600):  # the four are answered too: they waited their turn
        await asyncio.gather(*schemas)
    assert compiles(gw) - before == 4
    gw.state.prompts.check_integrity()
