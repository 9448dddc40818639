"""The visitor behind a request, as every per-visitor rule counts it: the visitor scope of the
rate limits (gateway/ratelimit/scopes.py), the prefix-cache scope of a widget visitor without a
session (gateway/chat/cache_scope.py) and the ledger's end user (gateway/chat/ledger.py).

    address   the TCP peer; when the peer is in KVGATE_TRUSTED_PROXIES, the right-most hop of
              the request's X-Forwarded-For headers (all of them, in order: a proxy that adds
              its own header beside the client's must not leave the client's to be read) that
              is not a trusted proxy
    visitor   the address, an IPv6 one as its KVGATE_VISITOR_IPV6_PREFIX network (/64)

One function for all of them, so a visitor that one rule counts as one is one for every rule.
"""

from __future__ import annotations

from aiohttp import web

from gateway.ratelimit.scopes import client_address, visitor_address
from gateway.settings import RateLimitSettings

FORWARDED_FOR = "X-Forwarded-For"


def request_address(request: web.Request, rl: RateLimitSettings) -> str:
    """The client's address (``client_address``, through ``rl``'s trusted proxies), ungrouped."""
    forwarded = ",".join(request.headers.getall(FORWARDED_FOR, ()))
    return client_address(request.remote, forwarded or None, rl.trusted_proxies)


def request_visitor(request: web.Request, rl: RateLimitSettings) -> str:
    """The visitor address of the request (``visitor_address`` of its client address)."""
    return visitor_address(request_address(request, rl), rl.visitor_ipv6_prefix)
