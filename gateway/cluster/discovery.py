"""``KVGATE_WORKERS`` entries -> worker URLs.

An entry is ``http://host:port``. A host name may resolve to several addresses (a Kubernetes
headless service gives one per ready pod): each address is a worker. Resolution runs every health
round, so pods that come and go are followed; a name that does not resolve yields nothing this
round (its workers' health checks fail and they are taken out).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit


def parse_workers(raw: str) -> tuple[str, ...]:
    """Comma-separated URLs; each must be http://host:port."""
    out = []
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        parts = urlsplit(item)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"{item!r}: expected http://host:port")
        out.append(f"http://{parts.netloc}")
    return tuple(out)


async def resolve_workers(endpoints: Sequence[str]) -> list[str]:
    urls: list[str] = []
    for endpoint in endpoints:
        parts = urlsplit(endpoint)
        host, port = parts.hostname or "", parts.port or 80
        if _is_ip(host) or host == "localhost":
            urls.append(endpoint)
            continue
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError:
            continue
        for addr in sorted({str(info[4][0]) for info in infos}):  # IPv4 / IPv6: a str
            urls.append(f"http://[{addr}]:{port}" if ":" in addr else f"http://{addr}:{port}")
    return list(dict.fromkeys(urls))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
