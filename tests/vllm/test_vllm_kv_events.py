"""A real vLLM server's KV events through kvgate's subscriber (engine/remote/kv_subscriber.py):
a completion's full prompt blocks arrive as ``BlockStored`` with the prompt's token ids."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from engine.remote.kv_events import BlockStored, EventBatch
from engine.remote.kv_subscriber import KVEventEndpoint, KVEventSubscriber
from tests.vllm.conftest import API_KEY
from tests.vllm.probes import BLOCK, async_client, random_ids, salt
from tests.vllm.servers import MODEL_NAME, VllmServer

WAIT_S = 120.0  # a completion on a loaded 2-core machine, then the event; ends when it arrives


@pytest.fixture
async def events(vllm_server: VllmServer) -> AsyncIterator[asyncio.Queue[EventBatch]]:
    """The server's batches (history first, by replay), pumped into a queue."""
    ep = KVEventEndpoint(vllm_server.base_url, vllm_server.kv_endpoint, vllm_server.replay_endpoint)
    queue: asyncio.Queue[EventBatch] = asyncio.Queue()
    async with KVEventSubscriber(ep) as sub:

        async def pump() -> None:
            async for batch in sub.batches():
                queue.put_nowait(batch)

        task = asyncio.create_task(pump())
        yield queue
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def stored_for(queue: asyncio.Queue[EventBatch], tokens: list[int]) -> list[BlockStored]:
    """The BlockStored events whose blocks are ``tokens``' full blocks, in order, once all have
    come (other tests' blocks are told apart by their random tokens)."""
    want = len(tokens) // BLOCK * BLOCK
    found: list[BlockStored] = []
    async with asyncio.timeout(WAIT_S):
        while sum(len(e.token_ids) for e in found) < want:
            batch = await queue.get()
            for e in batch.events:
                if isinstance(e, BlockStored) and _is_block_run_of(e, tokens):
                    found.append(e)
    return found


def _is_block_run_of(e: BlockStored, tokens: list[int]) -> bool:
    n = len(e.token_ids)
    return n > 0 and any(
        tuple(tokens[i : i + n]) == e.token_ids for i in range(0, len(tokens) - n + 1, BLOCK)
    )


async def complete(server: VllmServer, prompt: list[int], cache_salt: str) -> None:
    c = async_client(server, API_KEY)
    await c.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=2,
        temperature=0.0,
        extra_body={"cache_salt": cache_salt},
    )


async def test_a_completion_stores_its_full_prompt_blocks(
    vllm_server: VllmServer, events: asyncio.Queue[EventBatch]
) -> None:
    prompt = random_ids(2 * BLOCK + 50)
    await complete(vllm_server, prompt, salt())
    stored = await stored_for(events, prompt)
    tokens = [t for e in stored for t in e.token_ids]
    assert tokens == prompt[: 2 * BLOCK]  # the full blocks, in order; not the partial third
    hashes = [h for e in stored for h in e.block_hashes]
    assert len(hashes) == 2 and len(set(hashes)) == 2
    assert stored[0].parent_block_hash is None  # the prompt's first block
    if len(stored) == 2:  # one event per block: the second chains on the first
        assert stored[1].parent_block_hash == stored[0].block_hashes[-1]
    assert all(e.block_size == BLOCK and e.medium == "GPU" for e in stored)
    assert all(e.source == vllm_server.base_url for e in stored)


async def test_another_salt_stores_the_same_tokens_under_other_hashes(
    vllm_server: VllmServer, events: asyncio.Queue[EventBatch]
) -> None:
    """The salt is part of the first block's hash, and every later hash chains on it."""
    prompt = random_ids(2 * BLOCK + 1)
    await complete(vllm_server, prompt, "tenant-a-" + salt())
    first = await stored_for(events, prompt)
    await complete(vllm_server, prompt, "tenant-b-" + salt())
    second = await stored_for(events, prompt)
    a = [h for e in first for h in e.block_hashes]
    b = [h for e in second for h in e.block_hashes]
    assert len(a) == len(b) == 2 and not set(a) & set(b)
