"""Whose stored rows a request reads and writes, and the conversation's cache scope.

    widget key, session token   user:<session end user>   (the tenant signed it)
    widget key, no session      addr:<visitor address>    (gateway/access/visitor.py)
    server key                  key:<key id>              (every route of the key: GET and
                                                           DELETE carry no ``user``)

A server key's ``user`` / ``safety_identifier`` does not change the owner (the tenant's backend
holds the key and sees all it stores) but does keep end users apart in the cache, as in chat.
``prompt_cache_key`` narrows the cache scope further (within the owner, never across owners);
``prompt_cache_retention`` sets the retention priority of the blocks past the tenant prefix:

    none          CONVERSATION_PRIORITY (stored conversations outlive ordinary chat blocks)
    "in_memory"   the engine's default priority (evicted, then offloaded, like chat)
    "24h"         LONG_PRIORITY (the last to be evicted below the pinned tenant prefixes)
"""

from __future__ import annotations

import dataclasses

from aiohttp import web

from engine.api import GenerateOptions, PriorityRange
from gateway.access.auth import Principal
from gateway.access.visitor import request_visitor
from gateway.chat.cache_scope import end_user_identity, scope_for
from gateway.context import SETTINGS
from tenants.conversation_records import OwnerScope

DEFAULT_PRIORITY = 35  # engine/core/kv/types.py's (the boundary does not name it)
CONVERSATION_PRIORITY = 50
LONG_PRIORITY = 70
RETENTION = {None: CONVERSATION_PRIORITY, "in_memory": DEFAULT_PRIORITY, "24h": LONG_PRIORITY}


def owner_scope(request: web.Request, principal: Principal) -> OwnerScope:
    tenant = principal.runtime.tenant_id
    if not principal.is_widget:
        return OwnerScope(tenant, f"key:{principal.identity.key_id}")
    address = ""
    if principal.end_user_id is None:
        address = request_visitor(request, request.app[SETTINGS].ratelimit)
    return OwnerScope(tenant, end_user_identity(principal, None, address))


def conversation_options(
    request: web.Request,
    principal: Principal,
    options: GenerateOptions,
    shared: int,
    *,
    user: str | None,
    cache_key: str | None,
    retention: str | None,
) -> GenerateOptions:
    """``options`` with the conversation's cache scope and retention priority."""
    address = ""
    if principal.is_widget and principal.end_user_id is None:
        address = request_visitor(request, request.app[SETTINGS].ratelimit)
    identity = end_user_identity(principal, user, address)
    if cache_key is not None:
        identity = f"{identity}\x1fprompt_cache_key:{cache_key}"
    scope = scope_for(request, principal, identity, shared)
    priority = RETENTION.get(retention, CONVERSATION_PRIORITY)
    ranges = (PriorityRange(shared, None, priority),)
    return dataclasses.replace(options, cache_scope=scope, priorities=ranges)
