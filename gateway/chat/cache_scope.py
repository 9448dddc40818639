"""The prefix-cache scope of a chat request: the tenant prefix shared, the rest per end user.

Without it, visitors of one tenant could read each other's conversations off ``cached_tokens``
and time to first token (a guessed conversation that hits the cache was sent by someone). The
engine keys the blocks past the tenant's system-prompt segment with a salt per end user
(engine/core/kv/hashing.py), so a request hits the pinned tenant prefix and its own end user's
earlier turns, never another's::

    widget session token      user:<session end user>   signed by the tenant
    widget key, no session    addr:<visitor address>    the visitor of the per-visitor limits
                                                        (gateway/access/visitor.py: IPv6 by network)
    server key with `user`    user:<user>               the tenant's backend names its end user
    server key, no `user`     key:<key id>              see below

``user`` of a widget request is ignored: the browser sets it, and it would let a visitor claim
another's scope. A server key without ``user``: the gateway cannot tell the tenant's end users
apart, and the backend holding the key already sees every conversation it sends; its traffic
shares one scope per key (conversations continued through the key still reuse their turns,
different keys of a tenant, e.g. two applications, never share). A backend that serves several
end users through one key passes ``user`` (any stable opaque id) to keep them apart.

salt = HMAC-SHA256(tenant cache salt, identity) (16 bytes): workers see neither an end-user id nor
an address, and the salts of one tenant say nothing about another's.

On the vLLM backend a scope sharing the tenant prefix is served under the tenant's salt (vLLM
salts a whole prompt or nothing: engine/remote/vllm_wire.py). A tenant with ``vllm_visitor_salt``
gets scopes that share no token there, so each visitor's requests carry a salt of their own
(``shared_with_tenant``); kvgate's own engine keeps the tenant prefix shared either way.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from engine.api import CacheScope
from gateway.access.auth import Principal
from gateway.access.visitor import request_visitor
from gateway.context import SETTINGS
from tenants.runtime import TenantRuntime

SALT_BYTES = 16


def end_user_identity(principal: Principal, user: str | None, address: str) -> str:
    """Whose conversation this is, as far as the gateway can tell (see the module docstring)."""
    if principal.end_user_id is not None:
        return f"user:{principal.end_user_id}"
    if principal.is_widget:
        return f"addr:{address}"
    if user is not None:
        return f"user:{user}"
    return f"key:{principal.identity.key_id}"


def derive(cache_salt: str, identity: str, shared_tokens: int) -> CacheScope:
    mac = hmac.digest(cache_salt.encode(), identity.encode(), "sha256")
    return CacheScope(mac[:SALT_BYTES], shared_tokens)


def shared_with_tenant(backend: str, runtime: TenantRuntime, shared_tokens: int) -> int:
    """The prompt tokens a scope shares with the tenant's other visitors: the tenant prefix's,
    or none on the vLLM backend for a tenant with ``vllm_visitor_salt`` (a salt per visitor)."""
    if backend == "vllm" and runtime.vllm_visitor_salt:
        return 0
    return shared_tokens


def scope_for(request: web.Request, principal: Principal, identity: str, shared: int) -> CacheScope:
    """The scope of ``identity`` for the running backend; ``shared``: the tenant prefix's length."""
    backend = request.app[SETTINGS].cluster.backend
    runtime = principal.runtime
    return derive(runtime.cache_salt, identity, shared_with_tenant(backend, runtime, shared))


def request_cache_scope(
    request: web.Request, principal: Principal, user: str | None, shared_tokens: int
) -> CacheScope:
    """The scope of one chat request; ``shared_tokens``: its tenant prefix's length."""
    address = ""
    if principal.is_widget and principal.end_user_id is None:
        address = request_visitor(request, request.app[SETTINGS].ratelimit)
    identity = end_user_identity(principal, user, address)
    return scope_for(request, principal, identity, shared_tokens)
