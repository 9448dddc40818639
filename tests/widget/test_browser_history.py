"""The widget's history on the server, in Chromium: a page of another loopback origin embeds
the widget with a session URL (the tenant's backend issues session tokens for one visitor).
A reload keeps the conversation, a second browser context (another device: its own storage and
cookies) with a token of the same visitor sees it, "New conversation" starts empty, "Delete"
removes it, and none of it reaches another visitor."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page

from tests.gateway.harness import (
    LiveGateway,
    create_database,
    drop_database,
    live_gateway,
    make_settings,
    pg_url,
)
from tests.widget.browser import (
    HostSite,
    chromium,
    host_site,
    messages,
    require_chromium,
    wait_state,
)
from tests.widget.helpers import WidgetTenant, widget_tenant

pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class Env:
    gw: LiveGateway
    site: HostSite
    browser: Browser


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(
    template_database: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Env]:
    require_chromium()
    name = await create_database(template_database)
    try:
        var = tmp_path_factory.mktemp("widget-history")
        settings = make_settings(pg_url(name), var, KVGATE_DEFAULT_MAX_TOKENS="8")
        async with (
            live_gateway(settings, demo_model_dir) as gw,
            host_site(gw.base_url) as site,
            chromium() as browser,
        ):
            yield Env(gw, site, browser)
    finally:
        await drop_database(name)


async def history_tenant(env: Env, prefix: str) -> WidgetTenant:
    t = await widget_tenant(env.gw, prefix, [env.site.origin])
    await env.gw.admin("PUT", f"/tenants/{t.id}/widget", {"history": True})
    return t


def page_url(env: Env, t: WidgetTenant, visitor: str) -> str:
    """The host page of ``visitor``: its backend issues tokens for ``visitor-<name>``."""
    env.site.sessions[visitor] = (t.server_key, 600)
    session = f"{env.site.origin}/session/{visitor}"
    return env.site.url(t.widget_key, open="true", **{"session-url": session})


@pytest_asyncio.fixture(loop_scope="module")
async def device(env: Env) -> AsyncIterator[BrowserContext]:
    context = await env.browser.new_context(viewport={"width": 1000, "height": 800})
    yield context
    await context.close()


async def open_widget(context: BrowserContext, url: str) -> Page:
    page = await context.new_page()
    await page.goto(url)
    await wait_state(page, "ready")
    return page


ANSWERED = """n => {
  const host = document.querySelector('kvgate-chat');
  const done = host.shadowRoot.querySelectorAll('.msg.assistant:not([aria-busy])').length;
  return done >= n && host.dataset.state === 'ready';
}"""


async def send(page: Page, text: str) -> None:
    """Send ``text`` and wait for the whole answer."""
    answered = await page.evaluate(
        "() => document.querySelector('kvgate-chat').shadowRoot"
        ".querySelectorAll('.msg.assistant').length"
    )
    box = page.get_by_role("textbox", name="Message")
    await box.fill(text)
    await box.press("Enter")
    await page.wait_for_function(ANSWERED, arg=answered + 1, timeout=30_000)


async def chat(page: Page) -> list[tuple[str, str]]:
    return [(role, text) for role, text in await messages(page) if role != "greeting"]


async def test_reload_second_device_new_conversation_and_delete(
    env: Env, device: BrowserContext
) -> None:
    t = await history_tenant(env, "hist-browser")
    url = page_url(env, t, "alice")
    page = await open_widget(device, url)
    assert await chat(page) == []
    await send(page, "Where is my order?")
    await send(page, "It was order 4411.")
    before = await chat(page)
    assert [r for r, _ in before] == ["user", "assistant", "user", "assistant"]
    assert before[0][1] == "Where is my order?" and before[2][1] == "It was order 4411."

    # a reload shows the conversation the server kept
    await page.reload()
    await wait_state(page, "ready")
    assert await chat(page) == before
    # a new tab of the same browser, too
    tab = await open_widget(device, url)
    assert await chat(tab) == before
    await tab.close()

    # another device: its own storage and cookies, a new token for the same visitor
    other = await env.browser.new_context()
    try:
        second = await open_widget(other, url)
        assert await chat(second) == before
        assert env.site.session_calls["alice"] >= 3  # every page asked for its own token
        # another visitor of the same tenant on that device sees nothing of it
        stranger = await open_widget(other, page_url(env, t, "bob"))
        assert await chat(stranger) == []
    finally:
        await other.close()

    # "New conversation" starts empty, and stays so after a reload
    await page.get_by_role("button", name="New conversation").click()
    await page.wait_for_function(
        "() => !document.querySelector('kvgate-chat').shadowRoot.querySelector('.msg.user')"
    )
    assert await chat(page) == []
    await page.reload()
    await wait_state(page, "ready")
    assert await chat(page) == []
    await send(page, "A new question")
    assert [r for r, _ in await chat(page)] == ["user", "assistant"]

    # "Delete" removes it: gone after a reload, and for the operator too
    page_conv = await env.gw.admin("GET", f"/tenants/{t.id}/transcripts")
    assert len(page_conv["data"]) == 2  # the ended conversation and the current one
    await page.get_by_role("button", name="Delete", exact=True).click()
    await wait_state(page, "deleted")
    assert await chat(page) == []
    await page.reload()
    await wait_state(page, "ready")
    assert await chat(page) == []
    left = await env.gw.admin("GET", f"/tenants/{t.id}/transcripts")
    assert [c["turns"] for c in left["data"]] == [2]  # only the ended first conversation
