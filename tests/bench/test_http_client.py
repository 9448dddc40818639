"""The benchmarks' minimal HTTP/1.1 client against a real aiohttp server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from bench.http_client import RawHttpClient
from tests.loopback import serve_on_loopback


async def _echo(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"got": body, "auth": request.headers.get("Authorization")})


async def _chunked(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    await resp.write(b"data: 1\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, int]]:
    app = web.Application()
    app.router.add_post("/echo", _echo)
    app.router.add_post("/chunked", _chunked)
    async with serve_on_loopback(app) as address:
        yield address


async def test_posts_json_on_one_kept_alive_connection(server: tuple[str, int]) -> None:
    client = RawHttpClient(*server)
    try:
        writers = set()
        for i in range(3):
            body = {"n": i, "text": "héllo"}
            status, data = await client.post_json("/echo", body, {"Authorization": "Bearer k"})
            assert (status, data) == (200, {"got": body, "auth": "Bearer k"})
            writers.add(id(client._writer))
        assert len(writers) == 1  # one connection, kept alive
    finally:
        await client.close()


async def test_chunked_response_is_refused(server: tuple[str, int]) -> None:
    client = RawHttpClient(*server)
    try:
        with pytest.raises(RuntimeError, match="Content-Length"):
            await client.post_json("/chunked", {}, {})
    finally:
        await client.close()


async def test_reads_a_chunked_stream_to_its_end_and_keeps_the_connection(
    server: tuple[str, int],
) -> None:
    client = RawHttpClient(*server)
    try:
        for _ in range(2):
            status, data = await client.post_stream("/chunked", {}, {})
            assert (status, data) == (200, b"data: 1\n\ndata: [DONE]\n\n")
        status, data = await client.post_json("/echo", {"n": 1}, {})
        assert (status, data) == (200, {"got": {"n": 1}, "auth": None})
        with pytest.raises(RuntimeError, match="chunked"):
            await client.post_stream("/echo", {}, {})
    finally:
        await client.close()
