"""``register_widget(app, settings)``: every widget route on the gateway app, in one call."""

from __future__ import annotations

from aiohttp import web

from gateway.settings import Settings
from gateway.widget.cors import add_preflight
from gateway.widget.demo import DEMO_KEYS, DemoKeys, demo_page
from gateway.widget.history import current_conversation, delete_conversation, new_conversation
from gateway.widget.views import SCRIPT_PATH, Asset, create_session, widget_config

SCRIPT_ROUTE = "/widget/v1/kvgate-chat.js"
CONFIG_ROUTE = "/widget/v1/config"
SESSIONS_ROUTE = "/v1/widget/sessions"
DEMO_ROUTE = "/widget/demo"
CONVERSATION_ROUTE = "/v1/widget/conversation"  # the visitor's current one (history on)
CONVERSATIONS_ROUTE = "/v1/widget/conversations"


def register_widget(app: web.Application, settings: Settings) -> None:
    script = Asset.load(SCRIPT_PATH, "application/javascript; charset=utf-8")
    app.router.add_get(SCRIPT_ROUTE, script.serve)
    app.router.add_get(CONFIG_ROUTE, widget_config)
    app.router.add_post(SESSIONS_ROUTE, create_session)
    app.router.add_get(CONVERSATION_ROUTE, current_conversation)
    app.router.add_post(CONVERSATIONS_ROUTE, new_conversation)
    app.router.add_delete(CONVERSATIONS_ROUTE + "/{conversation_id}", delete_conversation)
    add_preflight(
        app,
        SCRIPT_ROUTE,
        CONFIG_ROUTE,
        SESSIONS_ROUTE,
        CONVERSATION_ROUTE,
        CONVERSATIONS_ROUTE,
        CONVERSATIONS_ROUTE + "/{conversation_id}",
    )
    if settings.widget.demo:
        app[DEMO_KEYS] = DemoKeys(settings.server.var_dir)
        app.router.add_get(DEMO_ROUTE, demo_page)
