"""The limiter's pooled script calls: timeouts and cancellations never leave a reply behind for
the next call, connections are reused and bounded. A scripted RESP server stands in for
Redis so replies can be delayed or withheld."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import TimeoutError as RedisTimeout

from gateway.ratelimit.calls import MAX_CONNECTIONS, ScriptCalls, make_script_client


class ScriptedRedis:
    """Answers EVALSHA with its last argument as a bulk string, after ``delays[name]`` seconds
    (None: never); anything else (the client's connect handshake) with +OK."""

    def __init__(self) -> None:
        self.delays: dict[str, float | None] = {}
        self.connections = 0
        self.open = 0
        self.server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self._writers.add(writer)
        try:
            while (command := await _read_command(reader)) is not None:
                if command[0].upper() != b"EVALSHA":
                    writer.write(b"+OK\r\n")
                    continue
                name = command[-1]
                delay = self.delays.get(name.decode(), 0.0)
                if delay is None:
                    continue  # withheld: this reply never comes
                await asyncio.sleep(delay)
                writer.write(b"$%d\r\n%b\r\n" % (len(name), name))
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            self.open -= 1
            self._writers.discard(writer)
            writer.close()

    async def drop_connections(self) -> None:
        """Close every client connection (as a restart does), keep listening."""
        for writer in list(self._writers):
            writer.close()
        await _settle(lambda: self.open == 0)

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self._writers):
            writer.close()
        await self.server.wait_closed()


async def _read_command(reader: asyncio.StreamReader) -> list[bytes] | None:
    header = await reader.readline()
    if not header:
        return None
    args = []
    for _ in range(int(header[1:])):
        size = int((await reader.readline())[1:])
        args.append((await reader.readexactly(size + 2))[:-2])
    return args


def _calls(scripted: ScriptedRedis, timeout_s: float) -> ScriptCalls:
    """As ``RedisLimiter.connect`` makes them: their own client, one deadline per call."""
    return ScriptCalls(make_script_client(scripted.url, timeout_s), "return 1", timeout_s)


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedRedis]:
    server = ScriptedRedis()
    await server.start()
    yield server
    await server.close()


async def _settle(cond) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 5
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_a_reply_that_comes_after_the_timeout_never_reaches_the_next_call(
    scripted: ScriptedRedis,
) -> None:
    calls = _calls(scripted, 0.1)
    scripted.delays["late"] = 0.4
    t0 = time.monotonic()
    with pytest.raises(RedisTimeout):
        await calls.run(["k"], ["late"])
    assert time.monotonic() - t0 < 0.3
    assert await calls.run(["k"], ["next"]) == b"next"
    assert scripted.connections == 2  # the timed-out connection was not reused
    await _settle(lambda: scripted.open == 1)
    await calls.close()


async def test_a_cancelled_call_closes_its_connection(scripted: ScriptedRedis) -> None:
    calls = _calls(scripted, 5.0)
    scripted.delays["never"] = None
    task = asyncio.ensure_future(calls.run(["k"], ["never"]))
    await _settle(lambda: scripted.connections == 1)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await calls.run(["k"], ["after"]) == b"after"
    assert scripted.connections == 2
    await _settle(lambda: scripted.open == 1)
    await calls.close()
    await _settle(lambda: scripted.open == 0)


async def test_connections_are_reused_and_a_burst_shares_at_most_max_connections(
    scripted: ScriptedRedis,
) -> None:
    calls = _calls(scripted, 5.0)
    for i in range(3):
        assert await calls.run(["k"], [f"seq{i}"]) == f"seq{i}".encode()
    assert scripted.connections == 1

    burst = MAX_CONNECTIONS + 8
    for i in range(burst):
        scripted.delays[f"burst{i}"] = 0.1  # all issued at once
    replies = await asyncio.gather(*(calls.run(["k"], [f"burst{i}"]) for i in range(burst)))
    assert replies == [f"burst{i}".encode() for i in range(burst)]
    assert scripted.connections == MAX_CONNECTIONS  # the rest waited for one, within the deadline
    assert scripted.open == MAX_CONNECTIONS
    await calls.drop_idle()
    await _settle(lambda: scripted.open == 0)
    assert await calls.run(["k"], ["again"]) == b"again"  # usable after dropping its connections
    await calls.close()
    await _settle(lambda: scripted.open == 0)


async def test_a_connection_closed_by_the_server_is_retried_once(
    scripted: ScriptedRedis,
) -> None:
    """A restart closes every pooled connection: the next call reconnects and succeeds."""
    calls = _calls(scripted, 5.0)
    assert await calls.run(["k"], ["before"]) == b"before"
    await scripted.drop_connections()
    assert await calls.run(["k"], ["after"]) == b"after"
    assert scripted.connections == 2
    await calls.close()
