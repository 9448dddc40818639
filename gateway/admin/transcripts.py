"""Admin routes of operators' transcripts (in the admin sub-app, behind its auth)::

GET    /v1/tenants/{id}/transcripts                 the tenant's stored conversations, newest
                                                    first (?limit, ?cursor, ?end_user=<owner>)
GET    /v1/tenants/{id}/transcripts/{conversation}  one conversation as a transcript
DELETE /v1/tenants/{id}/transcripts/{conversation}  delete it (editors)
GET    /v1/tenants/{id}/transcript-access           {enabled}
PUT    /v1/tenants/{id}/transcript-access           {enabled}: off refuses list and read (403)

Every list and read writes an audit row (``transcripts.list`` / ``transcripts.read``) in the
same transaction as the read: no transcript is shown without its row (tenants/transcripts.py).
"""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel

from gateway.admin.context import ADMIN_CONTEXT
from gateway.errors import register_error
from gateway.widget.body import read_json
from tenants import transcripts as tr
from tenants.errors import InvalidField
from tenants.schemas import parse
from tenants.transcript_schemas import TranscriptAccessIn

T = "/v1/tenants/{id}"


def _json(model: BaseModel) -> web.Response:
    return web.json_response(model.model_dump(mode="json"), headers={"Cache-Control": "no-store"})


def _limit(request: web.Request) -> int:
    try:
        return int(request.query.get("limit", "50"))
    except ValueError:
        raise InvalidField("limit must be an integer", param="limit") from None


async def list_transcripts(request: web.Request) -> web.Response:
    ctx = request.app[ADMIN_CONTEXT]
    tenant_id, q, actor = request.match_info["id"], request.query, ctx.actor
    page = await ctx.store.write(
        lambda s: tr.list_transcripts(
            s,
            tenant_id,
            actor=actor,
            limit=_limit(request),
            cursor=q.get("cursor") or None,
            end_user=q.get("end_user") or None,
        )
    )
    return _json(page)


async def read_transcript(request: web.Request) -> web.Response:
    ctx = request.app[ADMIN_CONTEXT]
    m, actor = request.match_info, ctx.actor
    tenant_id, conv_id = m["id"], m["conversation_id"]
    out = await ctx.store.write(lambda s: tr.read_transcript(s, tenant_id, conv_id, actor=actor))
    return _json(out)


async def delete_transcript(request: web.Request) -> web.Response:
    ctx = request.app[ADMIN_CONTEXT]
    m, actor = request.match_info, ctx.actor
    tenant_id, conv_id = m["id"], m["conversation_id"]
    await ctx.store.write(lambda s: tr.delete_transcript(s, tenant_id, conv_id, actor=actor))
    return web.json_response({"id": conv_id, "object": "conversation.deleted", "deleted": True})


async def get_access(request: web.Request) -> web.Response:
    store, tenant_id = request.app[ADMIN_CONTEXT].store, request.match_info["id"]
    return _json(await store.read(lambda s: tr.get_access(s, tenant_id)))


async def put_access(request: web.Request) -> web.Response:
    data = parse(TranscriptAccessIn, await read_json(request))
    ctx = request.app[ADMIN_CONTEXT]
    tenant_id, actor = request.match_info["id"], ctx.actor
    out = await ctx.store.write(lambda s: tr.set_access(s, tenant_id, data.enabled, actor=actor))
    return _json(out)


def add_transcript_routes(app: web.Application) -> None:
    register_error(tr.TranscriptsDisabled, 403, "permission_error", "transcripts_disabled")
    register_error(tr.TranscriptNotFound, 404, "not_found_error", "conversation_not_found")
    app.router.add_routes(
        [
            web.get(f"{T}/transcripts", list_transcripts),
            web.get(f"{T}/transcripts/{{conversation_id}}", read_transcript),
            web.delete(f"{T}/transcripts/{{conversation_id}}", delete_transcript),
            web.get(f"{T}/transcript-access", get_access),
            web.put(f"{T}/transcript-access", put_access),
        ]
    )
