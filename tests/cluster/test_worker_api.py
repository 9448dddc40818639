"""The worker's internal API: authentication, generate parity, abort on disconnect, events."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import msgspec
import pytest

from engine.api import GenerateOptions
from engine.params import SamplingParams
from engine.remote.client import WorkerClient
from gateway.cluster.local import LocalWorker
from tests.cluster.workers import KV_CACHE_BYTES, TOKEN

ROUTES = [
    ("GET", "/v1/info"),
    ("GET", "/v1/tokenizer"),
    ("GET", "/v1/load"),
    ("GET", "/v1/events"),
    ("POST", "/v1/generate"),
    ("POST", "/v1/abort"),
    ("POST", "/v1/pin"),
    ("POST", "/v1/unpin"),
]


async def test_calls_without_the_token_are_refused(three_workers: list[LocalWorker]) -> None:
    url = three_workers[0].url
    bad = [{}, {"Authorization": "Bearer wrong-token"}, {"Authorization": TOKEN}]
    async with aiohttp.ClientSession() as http:
        for method, path in ROUTES:
            for headers in bad:
                async with http.request(method, url + path, headers=headers, data=b"{}") as r:
                    assert r.status == 401, (method, path, headers)
        async with http.get(url + "/healthz") as r:  # probes need no token, learn nothing
            assert r.status == 200 and set(await r.json()) == {"status"}


async def test_generate_matches_the_in_process_engine(
    three_workers: list[LocalWorker], demo_model_dir: Path
) -> None:
    from engine import Engine

    eng = Engine.from_pretrained(demo_model_dir, device="cpu", kv_cache_bytes=KV_CACHE_BYTES)
    prompt = [(i * 37) % 1500 + 3 for i in range(40)]
    params = SamplingParams(
        max_tokens=6, temperature=0.0, logprobs=2, ignore_eos=True, repetition_penalty=1.3
    )
    want = eng.generate([prompt], params, namespace="parity")[0]
    async with aiohttp.ClientSession() as http:
        client = WorkerClient(three_workers[0].url, TOKEN, http)
        outs = [
            o
            async for o in client.generate(
                prompt, params, GenerateOptions(namespace="p", request_id="r1")
            )
        ]
        ends = client.generate(
            prompt, params, GenerateOptions(namespace="p2", request_id="r2", interim=False)
        )
        ends_only = [o async for o in ends]
    # without interim outputs: two frames, the same tokens and logprob entries
    assert len(outs) == 6 and len(ends_only) == 2
    assert ends_only[-1].token_ids == want.token_ids
    assert ends_only[0].new_token_ids + ends_only[1].new_token_ids == want.token_ids
    every_entry = [lp for o in outs for lp in o.new_logprobs or ()]
    assert [lp for o in ends_only for lp in o.new_logprobs or ()] == every_entry
    final = outs[-1]
    assert final.finished and final.finish_reason == want.finish_reason
    assert final.token_ids == want.token_ids
    assert sum((o.new_token_ids for o in outs), ()) == want.token_ids
    logprobs = [lp for o in outs for lp in o.new_logprobs or ()]
    assert [lp.token_id for lp in logprobs] == list(want.token_ids)
    assert all(len(lp.top) == 2 for lp in logprobs)
    assert final.metrics.first_token_time is not None


async def test_leaving_a_stream_aborts_the_request_on_the_worker(
    three_workers: list[LocalWorker],
) -> None:
    params = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)
    async with aiohttp.ClientSession() as http:
        client = WorkerClient(three_workers[1].url, TOKEN, http)
        stream = client.generate(
            [5, 6, 7, 8], params, GenerateOptions(namespace="abort", request_id="long")
        )
        first = await anext(stream)
        assert not first.finished
        load = await client.load()
        assert load.running == 1 and load.stats.blocks_in_use > 0
        await stream.aclose()  # the connection closes: the worker aborts the request
        async with asyncio.timeout(5):
            while (load := await client.load()).running or load.stats.blocks_in_use:
                await asyncio.sleep(0.02)


async def test_kv_events_name_the_blocks_a_request_stored(
    three_workers: list[LocalWorker],
) -> None:
    from engine.core.kv.hashing import block_keys, root_key

    prompt = [(i * 11) % 1500 + 3 for i in range(50)]
    async with aiohttp.ClientSession() as http:
        client = WorkerClient(three_workers[2].url, TOKEN, http)
        events = client.events()
        seen: set[str] = set()

        async def collect() -> None:
            async for batch in events:  # as the events travel: arrays
                seen.update(e[2] for e in msgspec.to_builtins(batch) if e[0] == "s")

        task = asyncio.create_task(collect())
        await asyncio.sleep(0.2)  # subscribed
        params = SamplingParams(max_tokens=1, temperature=0.0)
        async for _ in client.generate(
            prompt, params, GenerateOptions(namespace="ev", request_id="ev1")
        ):
            pass
        want = {k.hex() for k in block_keys(root_key("ev"), prompt, 16, 0, 3)}
        async with asyncio.timeout(5):
            while not want <= seen:
                await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
