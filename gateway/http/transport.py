"""The transport aiohttp's connection handler writes to: the client's socket, seen by the front.

It passes writes and closes through to the real transport, and tells the front (front.py)
what the front must know to write answers of its own without cutting into aiohttp's: how much
aiohttp wrote for the request it is handling, and whether it asked to pause reading. Once the
front has taken the connection over (its own answer is going out), aiohttp's writes are dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol


class Owner(Protocol):
    """What the transport reports to (front.FrontProtocol)."""

    taken_over: bool

    def inner_pause(self, paused: bool) -> None: ...

    def inner_close(self) -> None: ...

    def response_done(self) -> None: ...


class InnerTransport(asyncio.Transport):
    def __init__(self, real: asyncio.Transport, owner: Owner) -> None:
        super().__init__()
        self._real = real
        self._owner = owner
        self._protocol: asyncio.BaseProtocol | None = None
        self.written = 0  # bytes aiohttp wrote since the front last reset this
        self._paused = False
        self._closing = False

    @property
    def front(self) -> Owner:
        return self._owner

    # -- writing ------------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._owner.taken_over:
            return
        self.written += len(data)
        self._real.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.write(data)

    def can_write_eof(self) -> bool:
        return False  # HTTP/1.1 over TCP: the server never half-closes

    def write_eof(self) -> None:
        raise NotImplementedError("HTTP responses end by framing, not by a half-close")

    def get_write_buffer_size(self) -> int:
        return self._real.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._real.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._real.set_write_buffer_limits(high, low)

    # -- reading: aiohttp's flow control, combined with the front's ---------------------------
    def pause_reading(self) -> None:
        self._paused = True
        self._owner.inner_pause(True)

    def resume_reading(self) -> None:
        self._paused = False
        self._owner.inner_pause(False)

    def is_reading(self) -> bool:
        return not self._paused and not self._closing

    # -- closing ------------------------------------------------------------------------------
    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._owner.inner_close()

    def abort(self) -> None:
        self._closing = True
        self._real.abort()

    def is_closing(self) -> bool:
        return self._closing or self._real.is_closing()

    # -- the rest of asyncio's transport interface --------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._real.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None, "no protocol set"
        return self._protocol
