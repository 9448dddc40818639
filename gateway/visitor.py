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

from gateway.context import SETTINGS
from gateway.ratelimit.scopes import client_address, visitor_address

FORWARDED_FOR = "X-Forwarded-For"


def request_address(request: web.Request) -> str:
    """The client's address (``client_address``), ungrouped."""
    trusted = request.app[SETTINGS].ratelimit.trusted_proxies
    forwarded = ",".join(request.headers.getall(FORWARDED_FOR, ()))
    return client_address(request.remote, forwarded or None, trusted)


def request_visitor(request: web.Request) -> str:
    """The visitor address of the request (``visitor_address`` of its client address)."""
    prefix = request.app[SETTINGS].ratelimit.visitor_ipv6_prefix
    return visitor_address(request_address(request), prefix)
