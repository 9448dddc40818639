"""Which limits one chat request must fit in: the scopes of its admission.

    tenant    always: the tenant's limits
    key       when the API key has limits of its own (api_keys.rpm / tpm / max_concurrency)
    visitor   widget traffic (a widget key, or a session token's end user): per end user, else
              per visitor address; the tenant's visitor_* limits, else the gateway's defaults

The client address (``client_address``) is the TCP peer, or, when the peer is a trusted proxy
(KVGATE_TRUSTED_PROXIES), the right-most X-Forwarded-For hop that is not a trusted proxy
itself: the hops left of it were written by the client and prove nothing. An IPv4-mapped IPv6
address (::ffff:a.b.c.d, a dual-stack listener's view of an IPv4 peer) is that IPv4 address.
The visitor address (``visitor_address``) groups IPv6 by network (KVGATE_VISITOR_IPV6_PREFIX,
/64 by default): one subscriber gets a /64 or more and picks addresses in it at will (privacy
addresses), so a single IPv6 address is no more a visitor than a single port is. Visitor ids
are hashed (an address or end-user id is never a Redis key in clear).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.ratelimit.types import SCOPE_KEY, SCOPE_TENANT, SCOPE_VISITOR, Limits, Scope
from tenants.runtime import KeyIdentity, TenantRuntime

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
UNKNOWN_ADDRESS = "unknown"
DEFAULT_IPV6_PREFIX = 64


@dataclass(frozen=True)
class VisitorDefaults:
    """Per-visitor limits for tenants that set none (KVGATE_VISITOR_*)."""

    rpm: int = 20
    tpm: int = 20_000
    max_concurrency: int = 2


def admission_scopes(
    rt: TenantRuntime,
    key: KeyIdentity,
    end_user_id: str | None,
    visitor: str,
    defaults: VisitorDefaults,
) -> tuple[Scope, ...]:
    """``visitor``: the request's visitor address (``visitor_address``)."""
    lim = rt.limits
    scopes = [
        Scope(
            SCOPE_TENANT,
            rt.tenant_id,
            Limits(lim.rpm or 0, lim.tpm or 0, lim.max_concurrency or 0),
        )
    ]
    if (key.rpm, key.tpm, key.max_concurrency) != (None, None, None):
        own = Limits(key.rpm or 0, key.tpm or 0, key.max_concurrency or 0)
        scopes.append(Scope(SCOPE_KEY, key.key_id, own))
    if key.kind == "widget" or end_user_id is not None:
        who = f"user:{end_user_id}" if end_user_id is not None else f"addr:{visitor}"
        scopes.append(Scope(SCOPE_VISITOR, _digest(who), visitor_limits(rt, defaults)))
    return tuple(scopes)


def visitor_limits(rt: TenantRuntime, defaults: VisitorDefaults) -> Limits:
    own = rt.visitor_limits
    return Limits(
        defaults.rpm if own.rpm is None else own.rpm,
        defaults.tpm if own.tpm is None else own.tpm,
        defaults.max_concurrency if own.max_concurrency is None else own.max_concurrency,
    )


def client_address(
    peer: str | None, forwarded_for: str | None, trusted: Sequence[IPNetwork]
) -> str:
    """The client's address, normalized (``_parse``): the peer, unless the peer is a trusted
    proxy; then the right-most X-Forwarded-For hop that is not one. ``forwarded_for``: every
    X-Forwarded-For header of the request, joined by commas in their order.

    A hop that is not an address (the proxy that wrote it is misconfigured) gives
    ``UNKNOWN_ADDRESS``, one visitor for all such requests, never a new one per request. When
    every hop is a trusted proxy, the left-most one is the client."""
    ip = _parse(peer or "")
    if ip is None:
        return peer or UNKNOWN_ADDRESS  # not an IP peer (a Unix socket): one visitor
    if not forwarded_for or not _trusted(ip, trusted):
        return str(ip)
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        hop_ip = _parse(hop)
        if hop_ip is None:
            return UNKNOWN_ADDRESS
        if not _trusted(hop_ip, trusted):
            return str(hop_ip)
    return str(_parse(hops[0])) if hops else str(ip)


def visitor_address(address: str, ipv6_prefix: int = DEFAULT_IPV6_PREFIX) -> str:
    """The visitor a client address belongs to: an IPv4 address itself, an IPv6 address its
    ``/ipv6_prefix`` network (``2001:db8:1:2::/64``); anything else as it is."""
    ip = _parse(address)
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, ipv6_prefix), strict=False))
    return address if ip is None else str(ip)


def _trusted(ip: IPAddress, trusted: Sequence[IPNetwork]) -> bool:
    return any(ip in net for net in trusted)


def _parse(text: str) -> IPAddress | None:
    """An address as a hop or peer may write it: ``a.b.c.d``, ``a.b.c.d:port``, ``v6``,
    ``[v6]``, ``[v6]:port``, ``v6%zone``; an IPv4-mapped IPv6 address as its IPv4 address, no
    zone. None for anything else."""
    text = text.strip()
    if text.startswith("["):
        host, bracket, port = text[1:].partition("]")
        if not bracket or (port and not (port[0] == ":" and port[1:].isdigit())):
            return None
        text = host
    elif text.count(":") == 1:
        text, _, port = text.partition(":")
        if not port.isdigit():
            return None
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
