"""The worker transport (engine/worker/transport.py) and the gateway's channel to it: streams,
refusals, callers that leave, backpressure, a worker that goes away, other tokens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio
from aiohttp import web

from engine.api import GenerateOptions
from engine.async_engine import AsyncEngine
from engine.errors import PromptTooLong
from engine.params import SamplingParams
from engine.worker import messages as m
from engine.worker.curve import curve_keys
from engine.worker.events import KvEventHub
from engine.worker.server import WORKER, create_worker_app
from engine.worker.transport import WorkerTransport
from gateway.cluster.channel import WorkerChannel
from gateway.cluster.client import WorkerClient, WorkerLost, WorkerUnavailable
from tests.engine._tiny_model import kv_bytes, tiny_model_dir

TOKEN = "transport-token-0123456789abcdef"


@dataclass
class Served:
    url: str
    endpoint: str
    engine: AsyncEngine
    transport: WorkerTransport
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
    transport = WorkerTransport(app[WORKER])
    tport = await transport.start(["tcp://127.0.0.1:0"])
    assert tport is not None
    app[WORKER].info = msgspec.structs.replace(app[WORKER].info, transport_port=tport)
    async with aiohttp.ClientSession() as http:
        try:
            yield Served(
                f"http://{host}:{port}", f"tcp://127.0.0.1:{tport}", engine, transport, http
            )
        finally:
            await transport.close()
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


async def raw_dealer(endpoint: str, token: str = TOKEN) -> zmq.asyncio.Socket:
    """A bare DEALER with ``token``'s keys, to send what a WorkerChannel would not."""
    keys = curve_keys(token)
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey, sock.curve_secretkey = keys.client_public, keys.client_secret
    sock.connect(endpoint)
    return sock


async def test_malformed_messages_are_refused_and_the_worker_goes_on(served: Served) -> None:
    sock = await raw_dealer(served.endpoint)
    try:
        await sock.send(b"\xc1 not msgpack")  # names no call: dropped
        await sock.send(msgspec.msgpack.encode({"op": "generate", "call": 7, "token_ids": "x"}))
        reply = m.decode_reply(await asyncio.wait_for(sock.recv(), 5))
        assert isinstance(reply, m.Failed) and reply.call == 7
        assert reply.error.type == "ValueError"
        bad = {"op": "generate", "call": 8, "token_ids": [5], "params": {"max_tokens": 0}}
        await sock.send(msgspec.msgpack.encode({**bad, "options": {"request_id": "r"}}))
        reply = m.decode_reply(await asyncio.wait_for(sock.recv(), 5))
        assert isinstance(reply, m.Failed) and reply.call == 8  # SamplingParams' own check
        await sock.send(m.encode(m.Load(9)))  # the same connection is still served
        reply = m.decode_reply(await asyncio.wait_for(sock.recv(), 5))
        assert isinstance(reply, m.Loaded) and reply.load.healthy
    finally:
        sock.close()


async def test_a_peer_without_the_token_is_not_admitted(served: Served) -> None:
    chan = WorkerChannel(served.endpoint, "another-token-0123456789abcdef00", connect_s=2.0)
    with pytest.raises(WorkerUnavailable):
        await chan.request(m.Load, 2.0)
    await chan.close()
    good = served.client()
    assert (await good.load()).healthy  # the worker serves the others as before
    await good.close()


async def test_a_slow_reader_loses_no_frame(served: Served) -> None:
    sock = await raw_dealer(served.endpoint)
    sock.rcvhwm = 1
    try:
        options = GenerateOptions("n", "slow")
        await sock.send(m.encode(m.Generate(1, [5, 6, 7], _params(120), options)))
        await asyncio.sleep(1.0)  # nothing read: the worker's queue to us fills, then it waits
        frames = []
        while not (frames and frames[-1].finished):
            frames.append(m.decode_reply(await asyncio.wait_for(sock.recv(), 10)))
        assert len(frames) == 120
        assert frames[-1].token_ids == [t for f in frames for t in f.new_token_ids]
    finally:
        sock.close()


async def test_streams_of_a_worker_that_goes_away_end_with_worker_lost(served: Served) -> None:
    client = served.client()
    stream = client.generate([5, 6, 7, 8], _params(500), GenerateOptions("n", "gone"))
    await anext(stream)
    await served.transport.close()  # the worker's socket closes: the connection drops
    with pytest.raises(WorkerLost):
        async with asyncio.timeout(10):
            async for _ in stream:
                pass
    with pytest.raises(WorkerUnavailable) as refused:
        await client.load()  # nothing listens there now
    assert refused.value.refused
    await client.close()


async def test_a_worker_of_another_protocol_is_not_taken_in(served: Served) -> None:
    state = served.transport.state
    state.info = msgspec.structs.replace(state.info, protocol="0123456789abcdef")
    with pytest.raises(WorkerUnavailable, match="protocol"):
        await served.client().info()


def test_the_tokenizer_payload_rebuilds_the_same_tokenizer() -> None:
    from engine.model.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(tiny_model_dir())
    payload = m.from_json(m.to_json(m.TokenizerPayload.of(tok)), m.TokenizerPayload)
    again = payload.build()
    text = "hello tokenizer, once more"
    assert again.encode(text) == tok.encode(text)
    assert list(again.eos_token_ids) == list(tok.eos_token_ids)
    with pytest.raises(m.WireError):
        m.from_json(b'{"backend": 3}', m.TokenizerPayload)
