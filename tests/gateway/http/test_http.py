"""The HTTP layer under the app (gateway/http.py) on a small app over raw sockets: encodings,
malformed requests, read deadlines, aiohttp's log lines, request ids on refusals."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import structlog
from aiohttp import web

from gateway.errors import ApiError, error_middleware
from gateway.http import (
    AiohttpRedaction,
    content_encoding_middleware,
    install_log_redaction,
    make_runner,
)
from tests.gateway.redis_server import free_port

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.asyncio(loop_scope="module")

HEADER_S, BODY_S = 0.6, 0.6
MAX_BODY = 4096
SECRET = "sk-kvgate-SECRET-4f1d9c"


async def echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response({"bytes": len(body), "head": body[:16].decode("latin-1")})


async def busy(request: web.Request) -> web.Response:
    raise ApiError(503, "database unavailable", type_="service_unavailable", code="db_down")


GATE = web.AppKey("gate", asyncio.Event)  # GET /wait answers once the test sets it


async def wait(request: web.Request) -> web.Response:
    await request.app[GATE].wait()
    return web.json_response({"waited": True})


async def stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(3):
        await resp.write(f"data: {i}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def make_app() -> web.Application:
    app = web.Application(
        middlewares=[error_middleware, content_encoding_middleware], client_max_size=MAX_BODY
    )
    app[GATE] = asyncio.Event()
    app.router.add_post("/echo", echo)
    app.router.add_get("/busy", busy)
    app.router.add_get("/wait", wait)
    app.router.add_get("/stream", stream)
    sub = web.Application(middlewares=[error_middleware])
    sub.router.add_put("/v1/things/{id}", echo)
    app.add_subapp("/admin", sub)
    return app


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def port() -> AsyncIterator[int]:
    runner = make_runner(make_app(), HEADER_S, BODY_S, shutdown_timeout=1.0)
    await runner.setup()
    await runner.listen_tcp("127.0.0.1", 0)
    yield runner.addresses[0][1]
    await runner.cleanup()


class Reply:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1]) if lines[0].startswith("HTTP/") else 0
        self.headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}

    def json(self) -> Any:
        return json.loads(self.body)

    def assert_openai_error(self, status: int, code: str | None = None) -> dict[str, Any]:
        assert self.status == status, self.raw[:400]
        assert self.headers["content-type"].startswith("application/json"), self.raw[:400]
        err = self.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], err
        if code is not None:
            assert err["code"] == code, err
        assert self.headers.get("x-request-id"), self.headers
        return err


async def exchange(port: int, *parts: bytes, pause: float = 0.0, timeout: float = 5.0) -> Reply:
    """Send ``parts`` (``pause`` seconds apart) while reading, until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = bytearray()

    async def read_all() -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                received.extend(chunk)

    reading = asyncio.create_task(read_all())
    try:
        for i, part in enumerate(parts):
            if i and pause:
                await asyncio.sleep(pause)
            if reading.done():
                break  # the server closed the connection
            writer.write(part)
            await writer.drain()
    except ConnectionError:
        pass  # the server closed the connection: what did it answer?
    try:
        async with asyncio.timeout(timeout):
            await reading
        return Reply(bytes(received))
    finally:
        reading.cancel()
        writer.close()


def post(body: bytes, path: str = "/echo", method: str = "POST", **headers: str) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}"]
    head += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join([*head, "Connection: close"]) + "\r\n\r\n").encode() + body


def deflate(data: bytes) -> bytes:
    return zlib.compress(data)


# -- Content-Encoding ---------------------------------------------------------------------------
@pytest.mark.parametrize("path,method", [("/echo", "POST"), ("/admin/v1/things/1", "PUT")])
@pytest.mark.parametrize(
    ("encoding", "body", "status", "code"),
    [
        ("gzip", b'{"a": 1}', 400, "invalid_content_encoding"),  # not compressed
        ("deflate", b'{"a": 1}', 400, "invalid_content_encoding"),
        ("deflate", b"\x78\x9c" + b"\xff" * 20, 400, None),  # corrupt
        ("deflate", b"{}", 400, "invalid_content_encoding"),  # inflates, ends mid-stream
        ("br", b'{"a": 1}', 415, "unsupported_content_encoding"),
        ("zstd", b'{"a": 1}', 415, "unsupported_content_encoding"),
        ("x-gzip", gzip.compress(b"{}"), 415, "unsupported_content_encoding"),
        ("gzip, deflate", gzip.compress(b"{}"), 415, "unsupported_content_encoding"),
        ("compress", b"{}", 415, "unsupported_content_encoding"),
        ("foo", b"{}", 415, "unsupported_content_encoding"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 16 else None,
)
async def test_undecodable_bodies_are_openai_4xx(
    port: int, path: str, method: str, encoding: str, body: bytes, status: int, code: str | None
) -> None:
    with structlog.testing.capture_logs() as events:
        reply = await exchange(port, post(body, path, method, Content_Encoding=encoding))
    reply.assert_openai_error(status, code)
    assert [e["event"] for e in events] == ["request_refused"], events


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", gzip.compress(b'{"hello": "world"}')),
        ("GZIP", gzip.compress(b'{"hello": "world"}')),
        ("deflate", deflate(b'{"hello": "world"}')),
        ("identity", b'{"hello": "world"}'),
    ],
)
async def test_valid_encodings_are_decoded(port: int, encoding: str, body: bytes) -> None:
    reply = await exchange(port, post(body, Content_Encoding=encoding))
    assert reply.status == 200, reply.raw
    assert reply.json() == {"bytes": 18, "head": '{"hello": "world'}


@pytest.mark.parametrize("size", [MAX_BODY + 1, 64 << 20])
async def test_decompressed_size_is_capped(port: int, size: int) -> None:
    bomb = gzip.compress(b"0" * size)
    started = time.monotonic()
    reply = await exchange(port, post(bomb, Content_Encoding="gzip"))
    reply.assert_openai_error(413, "request_too_large")
    assert time.monotonic() - started < 3.0


# -- malformed requests and secrets -------------------------------------------------------------
HOSTILE = [
    f"Authorization: Bearer {SECRET}\x01".encode(),
    f"Authorization: Bearer {SECRET}\x00".encode(),
    f"Authorization: Bearer {SECRET}\x7f".encode(),
    f"Authorization: Bearer {SECRET}\r".encode(),
    f"X-Api-Key: {SECRET}\x1b[31m".encode(),
    f"Authorization\x01: Bearer {SECRET}".encode(),
    f"Authorization : Bearer {SECRET}".encode(),
    f"Authorization: Bearer {SECRET}".encode() + b"A" * 9000,  # a header line too long
    f"Authorization: Bearer {SECRET}\r\n continued".encode(),  # obsolete line folding
    f"Authorization: Bearer {SECRET}\xff".encode("latin-1"),  # obs-text: legal, reaches the app
]
ACCEPTED = {len(HOSTILE) - 1}


@pytest.mark.parametrize("case", range(len(HOSTILE)))
async def test_malformed_headers_answer_400_without_quoting(
    port: int, case: int, caplog: pytest.LogCaptureFixture
) -> None:
    header = HOSTILE[case]
    raw = b"POST /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + header
    raw += b"\r\nContent-Length: 2\r\n\r\n{}"
    with caplog.at_level(logging.DEBUG), structlog.testing.capture_logs() as events:
        reply = await exchange(port, raw)
    assert SECRET.encode() not in reply.raw
    if case in ACCEPTED:
        assert reply.status == 200, reply.raw
    else:
        reply.assert_openai_error(400)
    logged = caplog.text + repr(events)
    assert SECRET not in logged
    assert "sk-kvgate" not in logged


async def test_garbage_and_bad_request_lines_are_openai_400(port: int) -> None:
    for raw in [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + SECRET.encode() + b"\r\n\r\n",
        f"GET /{SECRET}\x01 HTTP/1.1\r\nHost: t\r\n\r\n".encode(),
        f"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: x{SECRET}\r\n\r\n".encode(),
        f"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: {SECRET}\r\n\r\n".encode(),
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + b"x" * 9,
    ]:
        reply = await exchange(port, raw)
        reply.assert_openai_error(400)
        assert SECRET.encode() not in reply.raw


async def test_aiohttp_records_lose_arguments_extras_and_exception_messages() -> None:
    install_log_redaction()
    install_log_redaction()  # idempotent
    assert logging.getLogger("aiohttp.server").filters.count(AiohttpRedaction()) <= 1
    try:
        raise ValueError(f"Invalid header value char: {SECRET}")
    except ValueError as exc:
        err = exc
    record = logging.LogRecord(
        "aiohttp.server", logging.ERROR, __file__, 1, "Error handling %s", (SECRET,),
        (type(err), err, err.__traceback__),
    )  # fmt: skip
    assert AiohttpRedaction().filter(record)
    text = logging.Formatter().format(record)
    assert SECRET not in text and "ValueError" in text and "Error handling" in text
    access = logging.LogRecord(
        "aiohttp.access",
        logging.INFO,
        __file__,
        1,
        f'"GET /?key={SECRET}" 200 "{SECRET}"',
        (),
        None,
    )
    access.__dict__.update(response_status=200, request_header={"Authorization": SECRET})
    AiohttpRedaction().filter(access)
    assert SECRET not in logging.Formatter().format(access) + repr(vars(access))


# -- read deadlines -----------------------------------------------------------------------------
async def test_slow_headers_get_408_and_close_within_the_deadline(port: int) -> None:
    started = time.monotonic()
    trickle = [b"POST /echo HTTP/1.1\r\n", b"Host: t\r\n", *[b"X-A: 1\r\n"] * 20]
    reply = await exchange(port, *trickle, pause=0.1)
    elapsed = time.monotonic() - started
    reply.assert_openai_error(408, "header_timeout")
    assert HEADER_S <= elapsed < HEADER_S + 0.5, elapsed


async def test_a_silent_connection_is_closed(port: int) -> None:
    started = time.monotonic()
    reply = await exchange(port)
    assert reply.raw == b""
    assert time.monotonic() - started < HEADER_S + 0.5


@pytest.mark.parametrize("path,method", [("/echo", "POST"), ("/admin/v1/things/1", "PUT")])
async def test_short_body_gets_408_and_close_within_the_deadline(
    port: int, path: str, method: str
) -> None:
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n".encode()
    started = time.monotonic()
    reply = await exchange(port, head + b'{"a": ')  # 94 bytes never come
    elapsed = time.monotonic() - started
    reply.assert_openai_error(408, "body_timeout")
    assert BODY_S <= elapsed < BODY_S + 0.5, elapsed


async def test_slow_body_gets_408(port: int) -> None:
    head = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 40\r\n\r\n"
    started = time.monotonic()
    reply = await exchange(port, head, *[b"x"] * 40, pause=0.05)
    reply.assert_openai_error(408, "body_timeout")
    assert time.monotonic() - started < BODY_S + 0.5


async def test_unread_slow_body_closes_the_connection(port: int) -> None:
    """A refusal before the body is read (404 here): the rest of the body is not waited for."""
    head = b"POST /nowhere HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n"
    started = time.monotonic()
    reply = await exchange(port, head + b"x")
    reply.assert_openai_error(404)
    assert time.monotonic() - started < BODY_S + 0.5


async def test_keep_alive_idle_time_is_not_header_time(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(2):
            writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            status = await reader.readline()
            assert b" 200 " in status, status
            await reader.readuntil(b'"head": "{}"}')
            await asyncio.sleep(HEADER_S * 1.5)  # idle between requests: keep-alive's business
    finally:
        writer.close()


# -- refusals: request id and one log line ------------------------------------------------------
async def test_refusals_carry_a_request_id_and_one_log_line(port: int) -> None:
    with structlog.testing.capture_logs() as events:
        replies = [
            await exchange(port, post(b"{}", "/nowhere")),
            await exchange(port, post(b"{}", Content_Encoding="foo")),
            await exchange(port, post(b"x" * (MAX_BODY + 1))),
            await exchange(port, b"GET / HTTP/1.1\r\nHost: t\x01\r\n\r\n"),
            await exchange(port, b"GET /busy HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"),
        ]
    refused = [e for e in events if e["event"] == "request_refused"]
    assert [(e["status"], e["reason"]) for e in refused] == [
        (404, "not_found"),
        (415, "unsupported_content_encoding"),
        (413, "request_too_large"),
        (400, "malformed_request"),
        (503, "db_down"),
    ]
    assert [e["request_id"] for e in refused] == [r.headers["x-request-id"] for r in replies]
    assert refused[1]["route"] == "POST /echo"


# -- run_app: what `kvgate serve` runs ----------------------------------------------------------
SERVE_SCRIPT = """
import sys
from gateway.http import run_app
from gateway.settings import TelemetrySettings
from gateway.telemetry import configure_logging
from tests.gateway.http.test_http import make_app

configure_logging(TelemetrySettings("debug", True, "test", None))
run_app(make_app(), host="127.0.0.1", port=int(sys.argv[1]), header_timeout_s=0.5,
        body_timeout_s=0.5, shutdown_timeout=1.0, print=lambda m: print(m, flush=True))
"""


async def test_run_app_serves_with_the_gateway_protocol_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = (tmp_path / "out.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT, str(port)], env=env, stdout=out, stderr=out
    )
    try:
        async with asyncio.timeout(20):
            while b"listening on" not in (tmp_path / "out.log").read_bytes():
                assert proc.poll() is None, (tmp_path / "out.log").read_text()
                await asyncio.sleep(0.05)
        raw = f"GET / HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {SECRET}\x01\r\n\r\n"
        (await exchange(port, raw.encode())).assert_openai_error(400, "malformed_request")
        (await exchange(port, b"POST /echo HTTP/1.1\r\n")).assert_openai_error(408)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    logged = (tmp_path / "out.log").read_text()
    assert logged.count('"event": "request_refused"') == 2, logged
    assert SECRET not in logged and "Traceback" not in logged, logged
