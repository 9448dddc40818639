"""The widget in a real browser while the gateway runs a tenant tool: the tool's status text is
shown in the status line while it runs (kvgate_tool_status chunks), then the answer follows and
the line is cleared. Widget clients send no tools: the tenant's come with its prompt version."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser
from yarl import URL

from tests.gateway.chat.tools.tenant.webhook_server import Receiver, webhook_receiver
from tests.gateway.harness import (
    LiveGateway,
    create_database,
    drop_database,
    live_gateway,
    make_settings,
    pg_url,
)
from tests.widget.browser import (
    HOST,
    HostSite,
    chromium,
    host_site,
    messages,
    require_chromium,
    shadow,
    wait_state,
)
from tests.widget.helpers import WidgetTenant, widget_tenant

pytestmark = pytest.mark.asyncio(loop_scope="module")

STATUS = "Checking your order..."


@dataclass
class Env:
    gw: LiveGateway
    site: HostSite
    browser: Browser
    receiver: Receiver


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(
    template_database: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Env]:
    require_chromium()
    name = await create_database(template_database)
    try:
        async with webhook_receiver() as receiver:
            var = tmp_path_factory.mktemp("widget-tools")
            settings = make_settings(
                pg_url(name),
                var,
                KVGATE_DEFAULT_MAX_TOKENS="24",
                KVGATE_TOOL_ALLOWED_HOSTS=URL(receiver.url).authority,
            )
            async with (
                live_gateway(settings, demo_model_dir) as gw,
                host_site(gw.base_url) as site,
                chromium() as browser,
            ):
                yield Env(gw, site, browser, receiver)
    finally:
        await drop_database(name)


def order_tool(env: Env) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
        "source": {"webhook": f"{env.receiver.url}/pause"},
        "status_text": STATUS,
    }


async def with_tool(env: Env, t: WidgetTenant) -> None:
    """The tenant's prompt version with one webhook tool the model must call once."""
    version = {
        "text": "You are a shop assistant.",
        "tools": [order_tool(env)],
        "tool_choice": {"type": "function", "function": {"name": "lookup_order"}},
        "max_tool_rounds": 1,
    }
    out = await env.gw.admin("PUT", f"/tenants/{t.id}/system-prompt", version)
    env.receiver.secret = out["webhook_secret"]
    await env.gw.wait_pinned(t.id)


async def test_a_running_tool_shows_its_status_line(env: Env) -> None:
    t = await widget_tenant(env.gw, "wtool", [env.site.origin])
    await with_tool(env, t)
    context = await env.browser.new_context(viewport={"width": 1000, "height": 800})
    page = await context.new_page()
    try:
        await page.goto(
            env.site.url(t.widget_key, open="true", temperature="0", **{"max-tokens": "60"})
        )
        await wait_state(page, "ready")
        box = page.get_by_role("textbox", name="Message")
        await box.fill("Where is order 12?")
        await box.press("Enter")
        await page.wait_for_function(
            f"t => {HOST}.shadowRoot.querySelector('[role=status]').textContent === t",
            arg=STATUS,
            timeout=15_000,
        )
        assert await shadow(page, "root.querySelector('[role=status].tool') !== null")
        await wait_state(page, "ready")
        assert await shadow(page, "root.querySelector('[role=status]').textContent") == ""
        roles = [role for role, _ in await messages(page)]
        assert roles == ["user", "assistant"]
        assert env.receiver.calls and env.receiver.calls[-1].verified
    finally:
        await context.close()


async def test_a_turn_with_a_tool_is_kept_on_the_server(env: Env) -> None:
    """The widget's history (docs/widget.md): a turn whose tool the gateway ran is kept like
    any other, the answer as the visitor saw it."""
    t = await widget_tenant(env.gw, "wtool-hist", [env.site.origin])
    await env.gw.admin("PUT", f"/tenants/{t.id}/widget", {"history": True})
    await with_tool(env, t)
    env.site.sessions["tools"] = (t.server_key, 600)
    session = f"{env.site.origin}/session/tools"
    url = env.site.url(t.widget_key, open="true", **{"max-tokens": "60", "session-url": session})
    context = await env.browser.new_context(viewport={"width": 1000, "height": 800})
    page = await context.new_page()
    try:
        await page.goto(url)
        await wait_state(page, "ready")
        box = page.get_by_role("textbox", name="Message")
        await box.fill("Where is order 12?")
        await box.press("Enter")
        await page.wait_for_function(
            f"() => {HOST}.shadowRoot.querySelector('.msg.assistant:not([aria-busy])') "
            f"&& {HOST}.dataset.state === 'ready'",
            timeout=30_000,
        )
        shown = await messages(page)
        await page.reload()
        await wait_state(page, "ready")
        assert await messages(page) == shown
        assert [role for role, _ in shown] == ["user", "assistant"]
        assert shown[0][1] == "Where is order 12?"
    finally:
        await context.close()
