"""The HTTP transport of MCP calls (the official SDK speaks httpx2): the egress rules of
gateway/chat/tools/run/egress.py, with the connection pinned to the address that was checked.

    host      every request stays on the MCP server's own host (the SDK's same-origin
              redirects included): the bearer token never reaches another host
    address   the name is resolved here, every address checked (public unless allowlisted), and
              the request sent to the checked address (Host header and TLS SNI keep the name),
              so a name that rebinds between the check and the connect cannot slip through
    bounds    each response body is capped (the SDK's own timeouts plus the caller's deadline)
    health    what the server's HTTP side did (a 5xx, a transport error) is kept in ``Health``:
              the SDK turns both into JSON-RPC errors that a server could also have sent, and
              only the HTTP side failing counts for the circuit breaker
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx2
from yarl import URL

from gateway.chat.tools.run.egress import (
    Allowlist,
    EgressRefused,
    TooLarge,
    check_url,
    public_address,
)


async def checked_address(host: str, port: int, allow: Allowlist) -> str:
    """The address to connect to: the first one the name resolves to, after every one of them
    passed the address rule."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [str(info[4][0]) for info in infos]
    if not addresses:
        raise EgressRefused(f"tool host {host!r} does not resolve")
    if not allow.allows(host, port):
        for a in addresses:
            if not public_address(ipaddress.ip_address(a.split("%", 1)[0])):
                raise EgressRefused(f"tool host {host!r} resolves to a non-public address")
    return addresses[0]


@dataclass
class Health:
    """The HTTP side of one MCP call: why the server failed as an HTTP service, if it did."""

    failure: str | None = None  # "HTTP 503", "ConnectError", "ReadTimeout", ...

    def failed(self, exc: httpx2.TransportError) -> None:
        self.failure = type(exc).__name__


class _Capped(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, cap: int, health: Health) -> None:
        self._inner = inner
        self._cap = cap
        self._health = health

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        try:
            async for chunk in self._inner:
                size += len(chunk)
                if size > self._cap:
                    raise TooLarge(f"response over {self._cap} bytes")
                yield chunk
        except httpx2.TransportError as exc:  # the connection broke in the body
            self._health.failed(exc)
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


class PinnedTransport(httpx2.AsyncBaseTransport):
    """Requests to one host only, each to an address checked just before."""

    def __init__(
        self, url: str, allow: Allowlist, max_bytes: int, health: Health | None = None
    ) -> None:
        target = URL(url)
        check_url(target, allow)
        assert target.host is not None  # check_url refuses a URL without one
        self._host = target.host.lower()
        self._allow = allow
        self._cap = max_bytes
        self._health = Health() if health is None else health
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False, retries=0)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = URL(str(request.url))
        if (url.host or "").lower() != self._host:
            raise EgressRefused("MCP requests stay on the server's host")
        check_url(url, self._allow)
        port = url.port or (443 if url.scheme == "https" else 80)
        address = await checked_address(self._host, port, self._allow)
        if address.strip("[]") != self._host.strip("[]"):
            ip = ipaddress.ip_address(address.split("%", 1)[0])
            request.url = request.url.copy_with(host=str(ip))
            request.headers["Host"] = url.raw_authority
            request.extensions = {**request.extensions, "sni_hostname": self._host}
        try:
            resp = await self._inner.handle_async_request(request)
        except httpx2.TransportError as exc:
            self._health.failed(exc)
            raise
        if resp.status_code >= 500:
            self._health.failure = f"HTTP {resp.status_code}"
        assert isinstance(resp.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            resp.status_code,
            headers=resp.headers,
            stream=_Capped(resp.stream, self._cap, self._health),
            extensions=resp.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def mcp_http_client(
    url: str,
    bearer: str | None,
    allow: Allowlist,
    max_bytes: int,
    timeout_s: float,
    health: Health,
) -> httpx2.AsyncClient:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    return httpx2.AsyncClient(
        transport=PinnedTransport(url, allow, max_bytes, health),
        headers={**headers, "User-Agent": "kvgate-tools/1"},
        timeout=httpx2.Timeout(timeout_s),
        follow_redirects=False,
        trust_env=False,
    )
