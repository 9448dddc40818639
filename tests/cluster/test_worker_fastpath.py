"""The worker's generate fast path (engine/worker/fastpath.py) in front of its aiohttp app:
generate calls, hand-over of other requests on the same connection, refusals, disconnects."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from engine.api import GenerateOptions
from engine.async_engine import AsyncEngine
from engine.params import SamplingParams
from engine.worker import wire
from engine.worker.events import KvEventHub
from engine.worker.fastpath import MAX_HEAD, GenerateConnections
from engine.worker.server import WORKER, create_worker_app
from gateway.cluster.client_http import HttpWorkerClient as WorkerClient
from tests.engine._tiny_model import kv_bytes, tiny_model_dir

TOKEN = "fastpath-token"
AUTH = f"Authorization: Bearer {TOKEN}\r\n"


@dataclass
class Served:
    host: str
    port: int
    factory: GenerateConnections
    engine: AsyncEngine

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    events = KvEventHub()
    engine = AsyncEngine.from_pretrained(
        tiny_model_dir(), listener=events, block_size=4, kv_cache_bytes=kv_bytes(256, 4)
    )
    app = create_worker_app(engine, events, TOKEN, "fast")
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    assert runner.server is not None
    factory = GenerateConnections(app[WORKER], runner.server)
    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    try:
        yield Served(host, port, factory, engine)
    finally:
        server.close()
        await factory.close()
        await runner.cleanup()


def _generate_request(body: dict | bytes, auth: str = AUTH, extra: str = "") -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = f"POST /v1/generate HTTP/1.1\r\nHost: w\r\n{auth}{extra}"
    return f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data


def _head(fields: str) -> bytes:
    return f"POST /v1/generate HTTP/1.1\r\n{AUTH}{fields}\r\n".encode()


def _body(max_tokens: int, rid: str = "r") -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return {"ids": [5, 6, 7, 8, 9], "params": wire.params_to_wire(params), "ns": "n", "rid": rid}


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status = int((await reader.readline()).split()[1])
    fields: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        fields[name.strip().lower()] = value.strip()
    if fields.get("transfer-encoding") == "chunked":
        body = b""
        while size := int((await reader.readline()).strip(), 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readline()
        return status, fields, body
    return status, fields, await reader.readexactly(int(fields.get("content-length", "0")))


async def test_generate_then_other_routes_on_one_connection(served: Served) -> None:
    reader, writer = await asyncio.open_connection(served.host, served.port)
    try:
        writer.write(_generate_request(_body(3)))
        status, fields, body = await _read_response(reader)
        frames = [json.loads(line) for line in body.splitlines()]
        assert status == 200 and fields["content-type"] == "application/x-ndjson"
        assert len(frames) == 3 and frames[-1]["f"] == 1
        assert [t for f in frames for t in f["n"]] == frames[-1]["t"]
        assert served.factory.open  # a generate connection stays on the fast path
        # the next request is not a generate call: aiohttp takes the connection over
        writer.write(f"GET /v1/load HTTP/1.1\r\nHost: w\r\n{AUTH}\r\n".encode())
        status, _, body = await _read_response(reader)
        assert status == 200 and json.loads(body)["healthy"] is True
        assert not served.factory.open
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\n")
        status, _, body = await _read_response(reader)
        assert (status, json.loads(body)) == (200, {"status": "ok"})
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (_generate_request(_body(2), auth=""), 401),
        (_generate_request(_body(2), auth="Authorization: Bearer wrong\r\n"), 401),
        (_head(""), 411),
        (_head("Transfer-Encoding: chunked\r\n") + b"0\r\n\r\n", 411),
        (_head("Content-Length: 1e99\r\n"), 400),
        (_head("Content-Length: 9999999999\r\n"), 413),
        (b"POST /v1/generate\r\n\r\n", 400),
        (b"POST /v1/generate HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD, 431),
    ],
)
async def test_refusals_answer_and_close(served: Served, request_bytes: bytes, status: int) -> None:
    reader, writer = await asyncio.open_connection(served.host, served.port)
    try:
        writer.write(request_bytes)
        got, fields, body = await _read_response(reader)
        assert got == status and fields["connection"] == "close" and "error" in json.loads(body)
        assert await reader.read() == b""  # closed
    finally:
        writer.close()
    assert served.engine.cache_stats().blocks_in_use == 0


async def test_a_body_over_the_limit_is_refused(served: Served) -> None:
    served.factory.max_body = 100
    reader, writer = await asyncio.open_connection(served.host, served.port)
    try:
        writer.write(_generate_request(b"x" * 101))
        assert (await _read_response(reader))[0] == 413
    finally:
        writer.close()


async def test_a_bad_body_is_a_value_error_for_the_client(served: Served) -> None:
    reader, writer = await asyncio.open_connection(served.host, served.port)
    try:
        writer.write(_generate_request(b'{"ids": "nope"}'))
        status, _, body = await _read_response(reader)
        assert status == 400 and json.loads(body)["e"]["type"] == "ValueError"
        writer.write(_generate_request(_body(1)))  # the connection is still usable
        status, _, body = await _read_response(reader)
        assert status == 200 and json.loads(body)["f"] == 1
    finally:
        writer.close()


async def test_a_caller_that_leaves_aborts_its_request(served: Served) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        client = WorkerClient(served.url, TOKEN, http)
        stream = client.generate(
            [5, 6, 7, 8], _params(500), GenerateOptions(namespace="n", request_id="long")
        )
        first = await anext(stream)
        assert not first.finished and served.engine.cache_stats().blocks_in_use > 0
        await stream.aclose()  # the connection closes: the fast path cancels the call
        async with asyncio.timeout(5):
            while served.engine.cache_stats().blocks_in_use:
                await asyncio.sleep(0.02)
        await client.close()
    assert not served.factory.open


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def test_an_engine_refusal_reaches_the_client_as_that_error(served: Served) -> None:
    import aiohttp

    from engine.errors import PromptTooLong

    async with aiohttp.ClientSession() as http:
        client = WorkerClient(served.url, TOKEN, http)
        too_long = list(range(3, 3 + served.engine.max_model_len + 1))
        with pytest.raises(PromptTooLong):
            async for _ in client.generate(
                too_long, _params(1), GenerateOptions(namespace="n", request_id="x")
            ):
                pass
        outs = [
            o
            async for o in client.generate(
                [5, 6], _params(2), GenerateOptions(namespace="n", request_id="y")
            )
        ]
        assert outs[-1].finished
        await client.close()
