"""Admin routes of a tenant's widget settings (in the admin sub-app, behind its bearer auth)::

GET  /v1/tenants/{id}/widget                  the settings (the secret only as a flag)
PUT  /v1/tenants/{id}/widget                  {title, greeting, accent, require_session,
                                               allow_client_system, max_choices,
                                               visitor_limits}
POST /v1/tenants/{id}/widget/rotate-secret    new session secret: every token is revoked
"""

from __future__ import annotations

from aiohttp import web

from gateway.admin.context import ADMIN_CONTEXT
from gateway.widget.body import read_json
from tenants.schemas import WidgetSettingsIn, WidgetSettingsOut, parse
from tenants.widget import WidgetStore


def _answer(out: WidgetSettingsOut) -> web.Response:
    return web.json_response(out.model_dump(mode="json"))


async def get_widget(request: web.Request) -> web.Response:
    store = WidgetStore(request.app[ADMIN_CONTEXT].store)
    return _answer(await store.get(request.match_info["id"]))


async def put_widget(request: web.Request) -> web.Response:
    data = parse(WidgetSettingsIn, await read_json(request))
    ctx = request.app[ADMIN_CONTEXT]
    return _answer(
        await WidgetStore(ctx.store).set(request.match_info["id"], data, actor=ctx.actor)
    )


async def rotate_secret(request: web.Request) -> web.Response:
    ctx = request.app[ADMIN_CONTEXT]
    out = await WidgetStore(ctx.store).rotate_secret(request.match_info["id"], actor=ctx.actor)
    return _answer(out)


def add_widget_admin_routes(app: web.Application) -> None:
    t = "/v1/tenants/{id}/widget"
    app.router.add_routes(
        [
            web.get(t, get_widget),
            web.put(t, put_widget),
            web.post(f"{t}/rotate-secret", rotate_secret),
        ]
    )
