"""The widget's conversation on the server (a tenant setting: ``PUT .../widget {history}``).

A session-token visitor's conversations live in the conversation store under the owner the
cache scope uses (``user:<end user>``, gateway/chat/cache_scope.py), so a reload, a new tab or
a second device with the same session token sees the same history; a bare widget key is public
and names no visitor, so it gets none (403: the widget then keeps the tab's copy)::

    GET    /v1/widget/conversation         the visitor's current conversation ({id, messages};
                                           id null if none)
    POST   /v1/widget/conversations        "New conversation": the current one ends (kept for
                                           the operator's transcripts, no longer shown), a new
                                           empty one is the current
    DELETE /v1/widget/conversations/{id}   delete one of the visitor's conversations (the
                                           current one: the widget then shows none)

A turn is kept by the chat route: a widget request naming its conversation
(``X-Kvgate-Conversation``) is checked before admission (another visitor's id, or none, is a
404) and, once the answer is complete, its last user message and the answer are saved as one
stored response of that conversation (before the stream's last event: a reload right after the
answer sees it). An answer that did not complete (stopped, failed) keeps nothing.

Each call of these routes is one request of the caller's limits (tenant, issuing key, visitor:
RPM and concurrency, as on the chat API; 429 with its headers beyond them).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from gateway.chat.admission import rate_limit_error, request_scopes
from gateway.chat.kept_turn import SOURCE, checked_id, conversation_not_found, owner_scope
from gateway.context import STATE
from gateway.ratelimit import Lease
from tenants.conversation_records import (
    ConversationNotFound,
    ConversationRecord,
    ItemRecord,
    OwnerScope,
)
from tenants.conversation_store import ConversationStore
from tenants.transcripts import item_text

ENDED = {"source": "widget-ended"}  # a conversation the visitor replaced with a new one
SCAN = 100  # the newest conversations of a visitor looked at for the current widget one


@asynccontextmanager
async def _visitor(request: web.Request) -> AsyncIterator[tuple[ConversationStore, OwnerScope]]:
    """The caller's store and scope, admitted as one request of its scopes (tenant, key,
    visitor: the chat API's RPM and concurrency; 429 beyond them), given back on exit."""
    state = request.app[STATE]
    principal = await state.keys.authenticate(request)
    scope = owner_scope(principal)
    lease = Lease.new(principal.runtime.tenant_id, request_scopes(request, principal), 0)
    try:
        decision = await state.limiter.acquire(lease)
        if not decision.allowed:
            raise rate_limit_error(decision)
        yield ConversationStore(state.store), scope
    finally:
        await asyncio.shield(state.limiter.release(lease, 0))


def message_of(item: ItemRecord) -> dict[str, str] | None:
    role = item.data.get("role")
    if item.type != "message" or role not in ("user", "assistant"):
        return None
    return {"role": str(role), "content": item_text(item.data)}


async def _answer(
    convs: ConversationStore, scope: OwnerScope, conv: ConversationRecord | None, status: int = 200
) -> web.Response:
    messages: list[dict[str, str]] = []
    if conv is not None:
        for item in await convs.conversation_history(scope, conv.id):
            message = message_of(item)
            if message is not None:
                messages.append(message)
    body = {"id": conv.id if conv else None, "messages": messages}
    return web.json_response(body, status=status, headers={"Cache-Control": "no-store"})


async def _current(convs: ConversationStore, scope: OwnerScope) -> ConversationRecord | None:
    page = await convs.list_conversations(scope, limit=SCAN)
    return next((c for c in page.conversations if c.metadata == SOURCE), None)


async def current_conversation(request: web.Request) -> web.Response:
    async with _visitor(request) as (convs, scope):
        return await _answer(convs, scope, await _current(convs, scope))


async def new_conversation(request: web.Request) -> web.Response:
    """The current conversation ends (kept, marked ``ENDED``: the widget no longer shows it);
    a new empty one is the current."""
    async with _visitor(request) as (convs, scope):
        current = await _current(convs, scope)
        if current is not None:
            await convs.update_conversation(scope, current.id, dict(ENDED))
        created = await convs.create_conversation(scope, dict(SOURCE))
        return await _answer(convs, scope, created, 201)


async def delete_conversation(request: web.Request) -> web.Response:
    conv_id = request.match_info["conversation_id"]
    async with _visitor(request) as (convs, scope):
        checked_id(conv_id)
        try:
            await convs.delete_conversation(scope, conv_id)
        except ConversationNotFound:
            raise conversation_not_found(conv_id) from None
    body = {"id": conv_id, "object": "conversation.deleted", "deleted": True}
    return web.json_response(body, headers={"Cache-Control": "no-store"})
