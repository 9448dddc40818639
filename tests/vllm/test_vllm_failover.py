"""Of two real vLLM servers, the one a tenant's requests stream from is killed under load:
requests not yet answered go to the other (no 5xx before the first token), streams cut
mid-answer end with an error event, and the ledger records what each client was told. The killed
server is started again by the next test that needs the pair (tests/vllm/conftest.py)."""

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
    async with vllm_gateway(template_database, servers, vllm_model, tmp_path) as gw:
        t = await gw.create_tenant("fo", system_prompt=SYSTEM)
        await gw.wait_pinned(t.id, timeout=120)
        client = gw.openai(t.key)
        model = gw.state.model_name
        first = [asyncio.create_task(ask(client, model, i)) for i in range(REQUESTS)]
        url = await _streaming_on(gw)
        victim = next(s for s in servers if s.base_url == url).process
        assert victim is not None
        os.killpg(victim.pid, signal.SIGKILL)  # the API server and its engine core
        victim.wait()
        later = [asyncio.create_task(ask(client, model, i)) for i in range(REQUESTS, REQUESTS + 4)]
        results = await asyncio.gather(*first, *later)
        await _check(gw, t.id, results)
        eng = cluster_of(gw)
        assert eng.members[url].healthy is False and eng.failovers >= 1
        cut = sum(r.error is not None for r in results)
        print(f"cut mid-stream: {cut}, retried before the first token: {eng.retries}")
        assert cut + eng.retries >= 1  # the requests in flight on it were cut or moved


async def _streaming_on(gw: LiveGateway) -> str:
    """The server the gateway has requests in flight on (the tenant's placed one), once some
    of them are past their first token."""
    eng = cluster_of(gw)
    async with asyncio.timeout(300):
        while not any(m.inflight for m in eng.members.values()):
            await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    return max(eng.members.values(), key=lambda m: m.inflight).url


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
        # the stream's status was 200 when it broke: its record names the stream's error and
        # counts the tokens delivered before it
        assert rec["error"] is not None and rec["completion_tokens"] >= r.chunks
