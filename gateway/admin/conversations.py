"""Admin routes deleting stored conversations (in the admin sub-app, behind its auth)::

DELETE /v1/tenants/{id}/conversations/{conversation_id}    one conversation, its responses
DELETE /v1/tenants/{id}/end-users/{end_user}/conversations  everything the end user stored
DELETE /v1/tenants/{id}/keys/{key_id}/conversations         everything stored through a server key

Each answers ``{"deleted": true, "conversations", "responses", "items"}``; an audit row names
what went (tenants/conversation_admin.py).
"""

from __future__ import annotations

from aiohttp import web

from gateway.admin.context import ADMIN_CONTEXT
from tenants.conversation_admin import ConversationAdmin, end_user_owner, purged_body
from tenants.conversation_records import Purged


def _answer(purged: Purged) -> web.Response:
    return web.json_response({"deleted": True, **purged_body(purged)})


async def delete_conversation(request: web.Request) -> web.Response:
    ctx, m = request.app[ADMIN_CONTEXT], request.match_info
    admin = ConversationAdmin(ctx.store)
    return _answer(await admin.delete_conversation(m["id"], m["conversation_id"], actor=ctx.actor))


async def delete_end_user(request: web.Request) -> web.Response:
    ctx, m = request.app[ADMIN_CONTEXT], request.match_info
    owner = end_user_owner(m["end_user"])
    return _answer(await ConversationAdmin(ctx.store).delete_owner(m["id"], owner, actor=ctx.actor))


async def delete_key_data(request: web.Request) -> web.Response:
    ctx, m = request.app[ADMIN_CONTEXT], request.match_info
    owner = f"key:{m['key_id']}"
    return _answer(await ConversationAdmin(ctx.store).delete_owner(m["id"], owner, actor=ctx.actor))


def add_conversation_admin_routes(app: web.Application) -> None:
    t = "/v1/tenants/{id}"
    app.router.add_routes(
        [
            web.delete(f"{t}/conversations/{{conversation_id}}", delete_conversation),
            web.delete(f"{t}/end-users/{{end_user}}/conversations", delete_end_user),
            web.delete(f"{t}/keys/{{key_id}}/conversations", delete_key_data),
        ]
    )
