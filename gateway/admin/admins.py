"""``/v1/admins``: admin principals (platform admins only, gateway/admin/access.py)::

POST   /v1/admins             {scope: "platform" | tenant id, access: "editor" | "viewer",
                               expires_at?, name?} -> 201 {id, token, ...} (token once)
GET    /v1/admins[?scope=]    {data: [...]} newest first (never a token or its hash)
GET    /v1/admins/{admin_id}
DELETE /v1/admins/{admin_id}  revoke: refused at once here, on other replicas through the
                              tenant event bus (within the token cache TTL without Redis)
"""

from __future__ import annotations

from aiohttp import web

from gateway.admin.context import ADMIN_CONTEXT
from gateway.widget.body import read_json
from tenants.admin_schemas import AdminCreate, AdminList
from tenants.admins import AdminStore
from tenants.schemas import parse


def _admins(request: web.Request) -> AdminStore:
    return AdminStore(request.app[ADMIN_CONTEXT].store)


async def create_admin(request: web.Request) -> web.Response:
    data = parse(AdminCreate, await read_json(request))
    created = await _admins(request).create(data, actor=request.app[ADMIN_CONTEXT].actor)
    response = web.json_response(created.model_dump(mode="json"), status=201)
    response.headers["Cache-Control"] = "no-store"
    return response


async def list_admins(request: web.Request) -> web.Response:
    admins = await _admins(request).list_all(request.query.get("scope"))
    return web.json_response(AdminList(data=admins).model_dump(mode="json"))


async def get_admin(request: web.Request) -> web.Response:
    admin = await _admins(request).get(request.match_info["admin_id"])
    return web.json_response(admin.model_dump(mode="json"))


async def revoke_admin(request: web.Request) -> web.Response:
    ctx = request.app[ADMIN_CONTEXT]
    out = await _admins(request).revoke(request.match_info["admin_id"], actor=ctx.actor)
    ctx.principals.forget()  # this replica at once, even with the bus's listeners failing
    return web.json_response(out.model_dump(mode="json"))


def add_admin_routes(app: web.Application) -> None:
    app.router.add_routes(
        [
            web.post("/v1/admins", create_admin),
            web.get("/v1/admins", list_admins),
            web.get("/v1/admins/{admin_id}", get_admin),
            web.delete("/v1/admins/{admin_id}", revoke_admin),
        ]
    )
