"""One of two real vLLM servers killed under load: requests not yet answered go to the other
(no 5xx before the first token), streams cut mid-answer end with an error event, and the ledger
records what each client was told. The killed server is started again by the next test that
needs the pair (tests/vllm/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import openai

from tests.gateway.harness import LiveGateway
from tests.vllm.conftest import VllmPair
from tests.vllm.gateway import SYSTEM, cluster_of, usage_records, vllm_gateway

REQUESTS = 8


@dataclass
class Told:
    request_id: str | None = None
    chunks: int = 0  # content deltas received
    usage: object = None
    error: str | None = None
    status: int | None = None  # an HTTP error status before the stream


async def ask(client: openai.AsyncOpenAI, model: str, i: int) -> Told:
    told = Told()
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Tell me about event number {i} this week."}],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=48,
            temperature=0,
        )
        async for chunk in stream:
            told.request_id = chunk.id
            if chunk.choices and chunk.choices[0].delta.content:
                told.chunks += 1
            if chunk.usage is not None:
                told.usage = chunk.usage
    except openai.APIStatusError as exc:
        told.status = exc.status_code
    except openai.APIError as exc:  # the stream's error event
        told.error = str(exc)
    return told


async def test_killing_a_replica_mid_load_fails_over_before_the_first_token(
    template_database: str, vllm_pair: VllmPair, vllm_model: Path, tmp_path: Path
) -> None:
    servers = vllm_pair.servers
    # a tenant hot enough for both replicas (rate per replica tiny)
    async with vllm_gateway(
        template_database, servers, vllm_model, tmp_path, KVGATE_REPLICA_RPS="0.01"
    ) as gw:
        t = await gw.create_tenant("fo", system_prompt=SYSTEM)
        await gw.wait_pinned(t.id, timeout=120)
        client = gw.openai(t.key, max_retries=0)
        model = gw.state.model_name
        first = [asyncio.create_task(ask(client, model, i)) for i in range(REQUESTS)]
        await _until_streaming(gw, servers[1].base_url)
        victim = servers[1].process
        assert victim is not None
        os.killpg(victim.pid, signal.SIGKILL)  # the API server and its engine core
        victim.wait()
        later = [asyncio.create_task(ask(client, model, i)) for i in range(REQUESTS, REQUESTS + 4)]
        results = await asyncio.gather(*first, *later)
        await _check(gw, t.id, results)
    report_retries = cluster_of(gw).retries
    assert report_retries >= 0


async def _until_streaming(gw: LiveGateway, url: str) -> None:
    """Until the gateway has requests in flight on ``url``."""
    eng = cluster_of(gw)
    async with asyncio.timeout(300):
        while eng.members[url].inflight == 0:
            await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # some of them past their first token


async def _check(gw: LiveGateway, tenant_id: str, results: list[Told]) -> None:
    assert all(r.status is None for r in results), [r.status for r in results]  # no 5xx
    cut = [r for r in results if r.error is not None]
    done = [r for r in results if r.error is None]
    assert all(r.usage is not None for r in done)
    assert all(r.chunks >= 1 for r in cut), "a stream failed before its first token"
    assert len(done) >= 4  # at least the requests sent after the kill
    records = {r["request_id"]: r for r in await usage_records(gw, tenant_id, len(results))}
    for r in done:
        rec = records[r.request_id]
        assert (rec["prompt_tokens"], rec["cached_tokens"], rec["completion_tokens"]) == (
            r.usage.prompt_tokens,
            r.usage.prompt_tokens_details.cached_tokens,
            r.usage.completion_tokens,
        )
    for r in cut:
        rec = records[r.request_id]
        assert rec["outcome"] != "answered" and rec["completion_tokens"] >= r.chunks
