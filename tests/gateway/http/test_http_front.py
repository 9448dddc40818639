"""The HTTP layer's front (gateway/http/front.py, framing.py) as a client meets it: several
requests per connection (keep-alive, pipelining), refusals in order, streamed answers, Unix
sockets, shutdown, and hostile heads that aiohttp's own parser would answer in plain text."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.http import GatewayRunner, make_runner
from tests.gateway.http.test_http import BODY_S, GATE, HEADER_S, SECRET, Reply, exchange, make_app

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served() -> AsyncIterator[tuple[GatewayRunner, int]]:
    runner = make_runner(make_app(), HEADER_S, BODY_S, shutdown_timeout=1.0)
    await runner.setup()
    await runner.listen_tcp("127.0.0.1", 0)
    yield runner, runner.addresses[0][1]
    await runner.cleanup()


@pytest.fixture
def gate(served: tuple[GatewayRunner, int]) -> asyncio.Event:
    event = served[0].app[GATE]
    event.clear()
    return event


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    """One response: a Content-Length body or a chunked one (to its last chunk)."""
    head = await reader.readuntil(b"\r\n\r\n")
    reply = Reply(head)
    if "content-length" in reply.headers:
        body = await reader.readexactly(int(reply.headers["content-length"]))
    else:
        body = await reader.readuntil(b"0\r\n\r\n")
    return Reply(head + body)


def request(method: str, path: str, body: bytes = b"", close: bool = False) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


# -- several requests per connection ------------------------------------------------------------
async def test_pipelined_requests_are_answered_in_order(served: tuple[GatewayRunner, int]) -> None:
    raw = (
        request("POST", "/echo", b'"a"')
        + request("GET", "/busy")
        + request("POST", "/echo", b"[1]")
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", served[1])
    try:
        writer.write(raw)  # one segment: three requests
        replies = [await read_reply(reader) for _ in range(3)]
    finally:
        writer.close()
    assert [r.status for r in replies] == [200, 503, 200]
    assert [replies[0].json()["head"], replies[2].json()["head"]] == ['"a"', "[1]"]
    replies[1].assert_openai_error(503, "db_down")


async def test_a_malformed_request_behind_valid_ones_is_refused_after_their_answers(
    served: tuple[GatewayRunner, int], gate: asyncio.Event
) -> None:
    bad = f"GET / HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {SECRET}\x01\r\n\r\n".encode()
    with structlog.testing.capture_logs() as events:
        reader, writer = await asyncio.open_connection("127.0.0.1", served[1])
        try:
            writer.write(request("GET", "/wait") + request("POST", "/echo", b"{}") + bad)
            await asyncio.sleep(0.05)
            gate.set()  # the first answer comes only now, after the bad request arrived
            replies = [await read_reply(reader) for _ in range(3)]
            assert await reader.read() == b""  # then the connection is closed
        finally:
            writer.close()
    assert [r.status for r in replies] == [200, 200, 400]
    replies[2].assert_openai_error(400, "malformed_request")
    assert SECRET.encode() not in b"".join(r.raw for r in replies)
    refused = [e for e in events if e["event"] == "request_refused"]
    assert [(e["status"], e["reason"]) for e in refused] == [(400, "malformed_request")]
    assert refused[0]["request_id"] == replies[2].headers["x-request-id"]


async def test_a_head_behind_a_slow_answer_is_not_late(
    served: tuple[GatewayRunner, int], gate: asyncio.Event
) -> None:
    """The header deadline of a pipelined request does not pass while aiohttp answers the one
    before it; it starts again once that answer is written."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served[1])
    try:
        writer.write(request("GET", "/wait") + b"POST /echo HTTP/1.1\r\nHost: t\r\n")
        await asyncio.sleep(HEADER_S * 1.5)  # the second head is incomplete past its deadline
        gate.set()
        assert (await read_reply(reader)).status == 200
        writer.write(b"Content-Length: 2\r\n\r\n{}")
        second = await read_reply(reader)
    finally:
        writer.close()
    assert second.status == 200 and second.json() == {"bytes": 2, "head": "{}"}


async def test_a_streamed_answer_then_another_request_on_the_connection(
    served: tuple[GatewayRunner, int],
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served[1])
    try:
        writer.write(request("GET", "/stream"))
        streamed = await read_reply(reader)
        writer.write(request("POST", "/echo", b"{}"))
        after = await read_reply(reader)
    finally:
        writer.close()
    assert streamed.status == 200 and streamed.headers["transfer-encoding"] == "chunked"
    assert b"data: 2\n\n" in streamed.body and b"data: [DONE]\n\n" in streamed.body
    assert after.status == 200


async def test_a_chunked_body_reaches_the_app_whole(served: tuple[GatewayRunner, int]) -> None:
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    raw += b"3;ext=1\r\n[12\r\n2\r\n3]\r\n0\r\nX-Trailer: t\r\n\r\n"
    reply = await exchange(served[1], raw[:60], raw[60:90], raw[90:], pause=0.02)
    assert reply.status == 200 and reply.json() == {"bytes": 5, "head": "[123]"}


# -- listeners and shutdown ---------------------------------------------------------------------
async def test_unix_socket_listener() -> None:
    runner = make_runner(make_app(), HEADER_S, BODY_S, shutdown_timeout=1.0)
    await runner.setup()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "gw.sock")
        await runner.listen_unix(path)
        try:
            replies = []
            for raw in (request("POST", "/echo", b"{}"), b"GET / HTTP/1.1\r\nHost: \x01\r\n\r\n"):
                reader, writer = await asyncio.open_unix_connection(path)
                writer.write(raw)
                replies.append(await read_reply(reader))
                writer.close()
        finally:
            await runner.cleanup()
    assert replies[0].status == 200
    replies[1].assert_openai_error(400, "malformed_request")


async def test_shutdown_lets_a_request_in_flight_finish_and_stops_listening() -> None:
    app = make_app()
    runner = make_runner(app, HEADER_S, BODY_S, shutdown_timeout=2.0)
    await runner.setup()
    await runner.listen_tcp("127.0.0.1", 0)
    port = runner.addresses[0][1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request("GET", "/wait"))
    await asyncio.sleep(0.05)
    cleanup = asyncio.ensure_future(runner.cleanup())
    await asyncio.sleep(0.05)
    with pytest.raises(OSError):  # no longer listening
        await asyncio.open_connection("127.0.0.1", port)
    app[GATE].set()
    reply = await read_reply(reader)
    writer.close()
    await cleanup
    assert reply.status == 200 and reply.json() == {"waited": True}


# -- hostile heads: never aiohttp's own answer --------------------------------------------------
METHODS = ["GET", "POST", "PUT", "OPTIONS", "CONNECT", "get", "FOO", "PRI", "G\x00T", ""]
TARGETS = ["/echo", "*", "http://t/echo", "http://[::1", "x:y", "/a b", "/\xff", "//", "/" * 9000]
VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.2", "http/1.1", "HTTP/11", ""]
HEADERS = [
    "Host: t",
    "Host: u",
    f"Authorization: Bearer {SECRET}",
    "Content-Type: application/json",
    "Content-Length: 2",
    "Content-Length: x",
    "Content-Length: 2, 2",
    "Transfer-Encoding: chunked",
    "Transfer-Encoding: gzip, chunked",
    "Transfer-Encoding: identity",
    "Content-Encoding: br",
    "Content-Encoding: deflate",
    "Upgrade: websocket\r\nConnection: Upgrade",
    "Sec-WebSocket-Key1: 1",
    "Expect: 100-continue",
    " folded",
    "X-A: " + "a" * 9000,
]
CONTROL = [chr(c) for c in (0, 1, 9, 10, 13, 27, 127)] + ["\xff", " "]
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _mostly(usual: str, odd: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.just(usual), st.just(usual), st.just(usual), st.sampled_from(odd))


def hostile_heads() -> st.SearchStrategy[bytes]:
    """Requests mostly well-formed in each part (so both parsers' acceptance is compared, not
    only their refusals), with odd methods, targets, versions, headers, control bytes around
    header lines and bare LF line ends the rest of the time."""
    control = st.lists(st.sampled_from(CONTROL), min_size=1, max_size=2).map("".join)
    junk = st.one_of(st.just(""), st.just(""), st.just(""), control)
    line = st.tuples(
        _mostly("POST", METHODS), _mostly("/echo", TARGETS), _mostly("HTTP/1.1", VERSIONS)
    )
    header = st.tuples(st.sampled_from(HEADERS), junk, st.booleans())
    eol = st.sampled_from(["\r\n"] * 5 + ["\n"])

    def build(parts: tuple) -> bytes:  # type: ignore[type-arg]
        (method, target, version), host, headers, end, body = parts
        lines = [f"{method} {target} {version}", *(["Host: t"] if host else [])]
        lines += [f"{h}{j}" if after else f"{j}{h}" for h, j, after in headers]
        lines.append("Connection: close")
        chunked = any("chunked" in h for h, _, _ in headers)
        payload = b"2\r\n{}\r\n0\r\n\r\n" if chunked else body
        return (end.join(lines) + "\r\n\r\n").encode("latin-1") + payload

    parts = st.tuples(
        line,
        st.sampled_from([True, True, True, False]),
        st.lists(header, max_size=3),
        eol,
        st.sampled_from([b"", b"{}"]),
    )
    return parts.map(build)


@FUZZ
@given(raw=hostile_heads())
async def test_hostile_heads_get_openai_answers_only(
    served: tuple[GatewayRunner, int], raw: bytes
) -> None:
    """Whatever the head, the answer is the front's or the app's: JSON with a request id, never
    aiohttp's plain text (which quotes the offending line), never a 5xx, never the secret."""
    got = await exchange(served[1], raw, timeout=HEADER_S + BODY_S + 3)
    if not got.raw:
        return  # closed without an answer (a request that never completes): nothing quoted
    final = got.raw
    while final.startswith(b"HTTP/1.1 100 "):  # an interim answer (Expect: 100-continue)
        final = final.partition(b"\r\n\r\n")[2]
    reply = Reply(final)
    assert 200 <= reply.status < 500, reply.raw[:300]
    assert SECRET.encode() not in reply.raw
    if reply.status >= 400:
        assert reply.headers["content-type"].startswith("application/json"), reply.raw[:300]
        assert reply.headers.get("x-request-id"), reply.raw[:300]
        reply.assert_openai_error(reply.status)


# -- the front's own contract -------------------------------------------------------------------
async def test_a_handler_that_writes_before_the_body_is_late_loses_the_connection(
    served: tuple[GatewayRunner, int],
) -> None:
    """``Expect: 100-continue``: aiohttp writes the interim answer, the body never comes; past
    the body deadline the connection is closed (an answer of the front would follow aiohttp's)."""
    raw = b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
    reply = await exchange(served[1], raw, timeout=BODY_S + 2)
    assert reply.status == 100 and b" 408 " not in reply.raw
