"""Outbound HTTP for tenant tools that cannot reach what it must not.

    URL         https only; a host in KVGATE_TOOL_ALLOWED_HOSTS (``host`` or ``host:port``) may
                use http and any address (the operator's own services, loopback test servers)
    addresses   every address a name resolves to must be public (``public_address``): no
                loopback, private (RFC 1918), link-local (169.254.0.0/16: cloud metadata
                169.254.169.254), CGNAT (100.64.0.0/10), unspecified, multicast or reserved
                IPv4; IPv6 only from global unicast (2000::/3, which leaves out ULA fc00::/7,
                link-local fe80::/10, site-local fec0::/10, multicast); an IPv6 form that
                carries an IPv4 address is judged by that address; IP literals are checked the
                same way
    when        at connect time: the connector's resolver (``SafeResolver``) checks what it
                returns, the DNS cache is off, so every connection resolves and checks again
                (a name that rebinds to 127.0.0.1 between two calls is refused on the second)
    redirects   never followed (a 3xx is an answer like any other error status)
    bounds      the body read up to ``max_bytes`` (64 KB by default), the whole call within
                ``timeout_s`` (5 s by default)
    isolation   no cookie jar (nothing one endpoint sets is sent anywhere), no proxy or netrc
                from the environment; each call carries only its own tenant's headers

A refusal is ``EgressRefused``; the caller turns it into a tool message, never a 5xx.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class EgressRefused(OSError):
    """The URL or an address it resolves to may not be reached."""


@dataclass(frozen=True)
class Allowlist:
    """Hosts (``host`` or ``host:port``, lowercase) exempt from the https and public-address
    rules."""

    entries: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, raw: str) -> Allowlist:
        return cls(frozenset(e.strip().lower() for e in raw.split(",") if e.strip()))

    def allows(self, host: str, port: int | None) -> bool:
        host = host.lower().strip("[]")
        return host in self.entries or f"{host}:{port}" in self.entries


GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: IPv4 in the last 32 bits
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: the operator's layout
IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # RFC 2765 (SIIT)
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # RFC 4291, deprecated; :: and ::1 fall in it


def public_address(ip: IPAddress) -> bool:
    """Whether ``ip`` may be reached by a tool call.

    An IPv6 address that carries an IPv4 address is judged by it, since the packet ends up
    there (through a NAT64 or SIIT translator, a 6to4 relay, a Teredo server, the host's own
    IPv4 stack)::

        ::ffff:a.b.c.d          IPv4-mapped          a.b.c.d
        ::ffff:0:a.b.c.d        IPv4-translated      a.b.c.d
        64:ff9b::a.b.c.d        NAT64 well-known     a.b.c.d
        2002:AABB:CCDD::/48     6to4                 AA.BB.CC.DD
        2001:0:SSSS:SSSS::…     Teredo               the server and the client (both public)
        ::a.b.c.d               IPv4-compatible      a.b.c.d (:: and ::1 as 0.0.0.0, 0.0.0.1)

    The NAT64 local-use prefix 64:ff9b:1::/48 is refused whole: where the IPv4 address sits
    in it depends on the operator's prefix length (RFC 6052 allows /48 to /96), so the address
    the translator would reach cannot be told. Any other IPv6 address must be global unicast.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        return ip.is_global and not ip.is_multicast and not ip.is_reserved
    if ip in NAT64_LOCAL_USE:
        return False
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        return all(public_address(v4) for v4 in embedded)
    return ip in GLOBAL_UNICAST and ip.is_global


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...] | None:
    """The IPv4 addresses an IPv6 form carries (``public_address``'s table), or None."""
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,)
    if ip.sixtofour is not None:
        return (ip.sixtofour,)
    if ip.teredo is not None:
        return ip.teredo
    if any(ip in net for net in (IPV4_TRANSLATED, NAT64_WELL_KNOWN, IPV4_COMPATIBLE)):
        return (ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF),)
    return None


def check_url(url: URL, allow: Allowlist) -> None:
    """The checks that need no DNS: scheme, host, and IP literals."""
    host = url.host
    if not url.is_absolute() or not host or url.scheme not in ("https", "http"):
        raise EgressRefused(f"tool URL must be an absolute https URL: {url.scheme or '?'}://")
    if url.user is not None or url.password is not None:
        raise EgressRefused("tool URL must not carry credentials")
    allowed = allow.allows(host, url.port)
    if url.scheme != "https" and not allowed:
        raise EgressRefused("tool URL must use https (http only for allowlisted hosts)")
    literal = _literal(host)
    if literal is not None and not allowed and not public_address(literal):
        raise EgressRefused(f"tool URL address {literal} is not a public address")


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


class SafeResolver(AbstractResolver):
    """aiohttp's threaded resolver, answering only public addresses (all or nothing: a name
    with one private address is refused, so a round-robin cannot slip one through)."""

    def __init__(self, allow: Allowlist) -> None:
        self._inner = aiohttp.ThreadedResolver()
        self._allow = allow

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if self._allow.allows(host, port):
            return found
        for r in found:
            ip = ipaddress.ip_address(r["host"].split("%", 1)[0])
            if not public_address(ip):
                raise EgressRefused(f"tool host {host!r} resolves to a non-public address")
        return found

    async def close(self) -> None:
        await self._inner.close()


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str


class TooLarge(Exception):
    """The response body is over the cap."""


class Egress:
    """One client session for every tool call of a gateway (open in ``cleanup_ctx``)."""

    def __init__(self, allow: Allowlist, *, timeout_s: float, max_bytes: int) -> None:
        self.allow = allow
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=SafeResolver(self.allow), use_dns_cache=False, limit=256
            )
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
            )
        return self._session

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float | None = None
    ) -> Reply:
        """POST ``body``; raises ``EgressRefused``, ``TooLarge``, ``TimeoutError`` or
        ``aiohttp.ClientError``."""
        target = URL(url)
        check_url(target, self.allow)
        limit = min(timeout_s or self.timeout_s, self.timeout_s)
        async with asyncio.timeout(limit):
            try:
                return await self._send(target, body, headers)
            except aiohttp.ClientConnectorError as exc:
                if isinstance(exc.os_error, EgressRefused):
                    raise exc.os_error from None
                raise

    async def _send(self, url: URL, body: bytes, headers: Mapping[str, str]) -> Reply:
        kwargs: dict[str, Any] = {"data": body, "headers": dict(headers)}
        async with self._client().post(url, allow_redirects=False, **kwargs) as resp:
            if resp.content_length is not None and resp.content_length > self.max_bytes:
                raise TooLarge(f"response of {resp.content_length} bytes")
            data = await _read_capped(resp.content, self.max_bytes)
            return Reply(resp.status, data, resp.content_type)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _read_capped(stream: aiohttp.StreamReader, cap: int) -> bytes:
    parts, size = [], 0
    async for chunk in stream.iter_chunked(16 << 10):
        size += len(chunk)
        if size > cap:
            raise TooLarge(f"response over {cap} bytes")
        parts.append(chunk)
    return b"".join(parts)
