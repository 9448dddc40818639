"""The worker transport (engine/serving/worker/transport.py) and the gateway's channel to it:
streams, refusals, callers that leave, a slow reader, a worker that is killed, other tokens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web

from engine.api import GenerateOptions
from engine.errors import PromptTooLong
from engine.params import SamplingParams
from engine.remote import messages as m
from engine.remote.channel import WorkerChannel
from engine.remote.client import WorkerClient, WorkerLost, WorkerUnavailable
from engine.remote.messages import CALLS_PATH
from engine.serving.async_engine import AsyncEngine
from engine.serving.worker.events import KvEventHub
from engine.serving.worker.server import WORKER, create_worker_app
from gateway.cluster.local import LocalWorker
from tests.cluster.workers import worker_env
from tests.engine._tiny_model import kv_bytes, tiny_model_dir

TOKEN = "transport-token-0123456789abcdef"


@dataclass
class Served:
    url: str
    engine: AsyncEngine
    app: web.Application
    runner: web.AppRunner
    http: aiohttp.ClientSession

    def client(self, token: str = TOKEN) -> WorkerClient:
        return WorkerClient(self.url, token, self.http)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    events = KvEventHub()
    engine = AsyncEngine.from_pretrained(
        tiny_model_dir(), listener=events, block_size=4, kv_cache_bytes=kv_bytes(256, 4)
    )
    app = create_worker_app(engine, events, TOKEN, "t0")
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    async with aiohttp.ClientSession() as http:
        try:
            yield Served(f"http://{host}:{port}", engine, app, runner, http)
        finally:
            await runner.cleanup()


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def _blocks_freed(engine: AsyncEngine) -> None:
    async with asyncio.timeout(5):
        while engine.cache_stats().blocks_in_use:
            await asyncio.sleep(0.02)


async def test_generate_streams_and_a_caller_that_leaves_aborts_its_request(served: Served) -> None:
    client = served.client()
    outs = [o async for o in client.generate([5, 6, 7], _params(3), GenerateOptions("n", "a"))]
    assert (
        len(outs) == 3
        and outs[-1].finished
        and outs[-1].token_ids == sum((o.new_token_ids for o in outs), ())
    )
    ends = client.generate([5, 6, 7], _params(3), GenerateOptions("n", "b", interim=False))
    assert len([o async for o in ends]) == 2  # first and final frames only
    stream = client.generate([5, 6, 7, 8], _params(500), GenerateOptions("n", "long"))
    first = await anext(stream)
    assert not first.finished and served.engine.cache_stats().blocks_in_use > 0
    await stream.aclose()  # Cancel: the worker leaves the engine stream
    await _blocks_freed(served.engine)
    await client.close()


async def test_an_engine_refusal_reaches_the_caller_as_that_error(served: Served) -> None:
    client = served.client()
    too_long = list(range(3, 3 + served.engine.max_model_len + 1))
    with pytest.raises(PromptTooLong):
        async for _ in client.generate(too_long, _params(1), GenerateOptions("n", "x")):
            pass
    outs = [o async for o in client.generate([5, 6], _params(2), GenerateOptions("n", "y"))]
    assert outs[-1].finished
    await client.close()


async def raw_peer(
    http: aiohttp.ClientSession, url: str, token: str = TOKEN
) -> aiohttp.ClientWebSocketResponse:
    """A bare connection to the transport, to send what a WorkerChannel would not."""
    headers = {"Authorization": f"Bearer {token}"}
    return await http.ws_connect(url + CALLS_PATH, headers=headers)


async def recv_reply(ws: aiohttp.ClientWebSocketResponse, timeout_s: float = 5) -> m.Reply:
    return m.decode_reply(await ws.receive_bytes(timeout=timeout_s))


async def test_malformed_messages_are_refused_and_the_worker_goes_on(served: Served) -> None:
    async with await raw_peer(served.http, served.url) as ws:
        await ws.send_bytes(b"\xc1 not msgpack")  # names no call: dropped
        await ws.send_str("a text frame")  # not part of the protocol: dropped
        await ws.send_bytes(msgspec.msgpack.encode({"op": "generate", "call": 7, "token_ids": "x"}))
        reply = await recv_reply(ws)
        assert isinstance(reply, m.Failed) and reply.call == 7
        assert reply.error.type == "ValueError"
        bad = {"op": "generate", "call": 8, "token_ids": [5], "params": {"max_tokens": 0}}
        await ws.send_bytes(msgspec.msgpack.encode({**bad, "options": {"request_id": "r"}}))
        reply = await recv_reply(ws)
        assert isinstance(reply, m.Failed) and reply.call == 8  # SamplingParams' own check
        await ws.send_bytes(m.encode(m.Load(9)))  # the same connection is still served
        reply = await recv_reply(ws)
        assert isinstance(reply, m.Loaded) and reply.load.healthy


async def test_a_peer_without_the_token_is_not_admitted(served: Served) -> None:
    chan = WorkerChannel(served.url, "another-token-0123456789abcdef00", served.http)
    with pytest.raises(WorkerUnavailable, match="upgrade refused"):
        await chan.request(m.Load, 2.0)
    assert chan.denied and not chan.refused
    await chan.close()
    with pytest.raises(aiohttp.WSServerHandshakeError) as raw:
        await served.http.ws_connect(served.url + CALLS_PATH)  # no token at all
    assert raw.value.status == 401
    good = served.client()
    assert (await good.load()).healthy  # the worker serves the others as before
    await good.close()


async def test_a_slow_reader_loses_no_frame(served: Served) -> None:
    async with await raw_peer(served.http, served.url) as ws:
        options = GenerateOptions("n", "slow")
        await ws.send_bytes(m.encode(m.Generate(1, [5, 6, 7], _params(120), options)))
        await asyncio.sleep(1.0)  # nothing read meanwhile: the frames wait in the buffers
        frames: list[m.Output] = []
        while not (frames and frames[-1].finished):
            reply = await recv_reply(ws, 10)
            assert isinstance(reply, m.Output)
            frames.append(reply)
        assert len(frames) == 120
        assert frames[-1].token_ids == [t for f in frames for t in f.new_token_ids]


async def test_streams_of_a_worker_that_is_killed_end_with_worker_lost(
    demo_model_dir: Path,
) -> None:
    worker = await asyncio.to_thread(
        LocalWorker.start, str(demo_model_dir), 120, token=TOKEN, env=worker_env()
    )
    try:
        async with aiohttp.ClientSession() as http:
            client = WorkerClient(worker.url, TOKEN, http)
            stream = client.generate([5, 6, 7, 8], _params(500), GenerateOptions("n", "gone"))
            await anext(stream)
            worker.proc.kill()  # the connection drops with no last frame
            with pytest.raises(WorkerLost):
                async with asyncio.timeout(10):
                    async for _ in stream:
                        pass
            with pytest.raises(WorkerUnavailable) as refused:
                await client.load()  # nothing listens there now
            assert refused.value.refused
            await client.close()
    finally:
        await worker.stop()


async def test_a_worker_of_another_protocol_is_not_taken_in(served: Served) -> None:
    state = served.app[WORKER]
    state.info = msgspec.structs.replace(state.info, protocol="0123456789abcdef")
    with pytest.raises(WorkerUnavailable, match="protocol"):
        await served.client().info()


def test_the_tokenizer_payload_rebuilds_the_same_tokenizer() -> None:
    from engine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(tiny_model_dir())
    payload = m.from_json(m.to_json(m.TokenizerPayload.of(tok)), m.TokenizerPayload)
    again = payload.build()
    text = "hello tokenizer, once more"
    assert again.encode(text) == tok.encode(text)
    assert list(again.eos_token_ids) == list(tok.eos_token_ids)
    with pytest.raises(m.WireError):
        m.from_json(b'{"backend": 3}', m.TokenizerPayload)
