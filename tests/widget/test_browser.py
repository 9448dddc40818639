"""The widget in a real browser (Debian's Chromium, headless), embedded in a page served from
another loopback origin than the gateway. One gateway, one browser for the module; each test
its own tenant and browser context (fresh sessionStorage)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page

from gateway.context import TELEMETRY
from tests.gateway.harness import (
    LiveGateway,
    create_database,
    drop_database,
    live_gateway,
    make_settings,
    pg_url,
    wait_for,
)
from tests.loopback import serve_on_loopback
from tests.widget.browser import (
    HOST,
    HostSite,
    chromium,
    host_site,
    messages,
    require_chromium,
    scripted_backend,
    shadow,
    usage_log_script,
    wait_state,
)
from tests.widget.helpers import new_session, widget_tenant

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Records each length of the newest assistant message as the DOM changes.
OBSERVE_JS = f"""() => {{
  window.__lengths = [];
  const log = {HOST}.shadowRoot.querySelector('[role=log]');
  new MutationObserver(() => {{
    const m = [...log.querySelectorAll('.msg.assistant')].pop();
    if (m) window.__lengths.push(m.textContent.length);
  }}).observe(log, {{ childList: true, subtree: true, characterData: true }});
}}"""

FETCH_JS = """async ([url, bearer, model]) => {
  try {
    const r = await fetch(url, { method: 'POST', headers: { Authorization: 'Bearer ' + bearer,
      'Content-Type': 'application/json' },
      body: JSON.stringify({ model, max_tokens: 1,
                             messages: [{ role: 'user', content: 'hi' }] }) });
    const body = await r.json();
    return [r.status, body.error ? body.error.code : null];
  } catch (e) { return ['blocked', null]; }
}"""


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
        var = tmp_path_factory.mktemp("widget-browser")
        settings = make_settings(pg_url(name), var, KVGATE_DEFAULT_MAX_TOKENS="24")
        async with (
            live_gateway(settings, demo_model_dir) as gw,
            host_site(gw.base_url) as site,
            chromium() as browser,
        ):
            yield Env(gw, site, browser)
    finally:
        await drop_database(name)


@pytest_asyncio.fixture(loop_scope="module")
async def page(env: Env) -> AsyncIterator[Page]:
    context = await env.browser.new_context(viewport={"width": 1000, "height": 800})
    page = await context.new_page()
    page.dialogs = []  # type: ignore[attr-defined]
    page.on("dialog", lambda d: page.dialogs.append(d.message))  # type: ignore[attr-defined]
    yield page
    await context.close()


async def send(page: Page, text: str) -> None:
    box = page.get_by_role("textbox", name="Message")
    await box.fill(text)
    await box.press("Enter")


async def usages(page: Page, n: int) -> list[dict[str, Any]]:
    await page.wait_for_function("n => window.__usage.length >= n", arg=n, timeout=20_000)
    return await page.evaluate("window.__usage")


async def status_text(page: Page) -> str:
    return await shadow(page, "root.querySelector('[role=status]').textContent")


async def test_streams_reports_usage_and_cached_tokens(env: Env, page: Page) -> None:
    t = await widget_tenant(env.gw, "stream", [env.site.origin])
    await env.gw.wait_pinned(t.id)
    # Long enough (a few hundred ms on the CPU) to arrive in several network reads.
    url = env.site.url(t.widget_key, open="true", temperature="0", **{"max-tokens": "400"})
    await page.goto(url)
    await wait_state(page, "ready")
    await page.evaluate(usage_log_script())
    await page.evaluate(OBSERVE_JS)
    await send(page, "Hello, when do you open?")
    first = (await usages(page, 1))[0]
    await wait_state(page, "ready")
    lengths = [n for n in await page.evaluate("window.__lengths") if n > 0]
    assert len(set(lengths)) >= 3, lengths  # rendered piece by piece as tokens arrived
    assert first["completion_tokens"] > 0
    await send(page, "And on Sunday?")
    second = (await usages(page, 2))[1]
    await wait_state(page, "ready")
    assert second["cached_tokens"] > 0 and second["prompt_tokens"] > first["prompt_tokens"]
    cached = await page.evaluate(f"{HOST}.dataset.usageCachedTokens")
    assert cached == str(second["cached_tokens"])
    roles = [role for role, _ in await messages(page)]
    assert roles == ["user", "assistant", "user", "assistant"]
    # The host page's hostile CSS (hide buttons, red 40px text) does not reach the widget.
    launcher = page.get_by_role("button", name=re.compile("chat", re.I)).first
    assert await launcher.is_visible()
    size = await shadow(page, "getComputedStyle(root.querySelector('.msg')).fontSize")
    assert size == "15px"


async def test_origin_not_allowed_shows_error_and_sends_nothing(env: Env, page: Page) -> None:
    t = await widget_tenant(env.gw, "origin", ["https://elsewhere.example"])
    chats: list[int] = []
    page.on("response", lambda r: chats.append(r.status) if "/chat/" in r.url else None)
    await page.goto(env.site.url(t.widget_key, open="true"))
    await wait_state(page, "error")
    assert "not allowed" in await status_text(page)
    assert await page.get_by_role("button", name="Send").is_disabled()
    await send(page, "hello?")
    url = f"{env.gw.base_url}/v1/chat/completions"
    direct = await page.evaluate(FETCH_JS, [url, t.widget_key, env.gw.state.model_name])
    assert direct[0] in ("blocked", 403)
    assert 200 not in chats
    assert [role for role, _ in await messages(page)] == []


async def test_stop_aborts_and_the_gateway_frees_the_request(env: Env, page: Page) -> None:
    t = await widget_tenant(env.gw, "stop", [env.site.origin], limits={"max_output_tokens": 1500})
    await env.gw.wait_pinned(t.id)
    engine = env.gw.state.engine
    baseline = engine.cache_stats().blocks_in_use
    url = env.site.url(t.widget_key, open="true", temperature="0", **{"max-tokens": "1500"})
    await page.goto(url)
    await wait_state(page, "ready")
    await send(page, "Tell me a long story")
    await page.wait_for_function(
        f"() => [...{HOST}.shadowRoot.querySelectorAll('.msg.assistant')].some("
        "m => m.textContent.length > 0)"
    )
    assert engine.cache_stats().blocks_in_use > baseline
    await page.get_by_role("button", name="Stop").click()
    await wait_state(page, "stopped")
    await wait_for(lambda: engine.cache_stats().blocks_in_use == baseline, timeout=3.0)
    info = await env.gw.admin("GET", f"/tenants/{t.id}/cache")
    assert info["inflight_requests"] == 0
    metrics = env.gw.app[TELEMETRY].metrics.render().decode()
    assert f'kvgate_requests_total{{status="499",tenant="{t.id}"}} 1.0' in metrics
    stopped = await shadow(page, "root.querySelectorAll('.msg.assistant.stopped').length")
    assert stopped == 1
    assert await page.get_by_role("button", name="Send").is_enabled()


async def test_rate_limit_shows_a_countdown(env: Env, page: Page) -> None:
    t = await widget_tenant(env.gw, "rl", [env.site.origin], limits={"rpm": 1})
    await page.goto(env.site.url(t.widget_key, open="true"))
    await wait_state(page, "ready")
    await page.evaluate(usage_log_script())
    await send(page, "one")
    await usages(page, 1)
    await wait_state(page, "ready")
    await send(page, "two")
    await wait_state(page, "rate-limited")
    first = int(re.findall(r"again in (\d+) s", await status_text(page))[0])
    assert first > 2  # from Retry-After: the minute's one request is spent
    assert await page.get_by_role("button", name="Send").is_disabled()
    await page.wait_for_timeout(1300)
    later = int(re.findall(r"again in (\d+) s", await status_text(page))[0])
    assert later < first


async def test_model_output_is_rendered_as_text_only(env: Env, page: Page) -> None:
    chunks = [
        'Hi <img src=x onerror="window.__xss=1;alert(1)">',
        " and <scr",
        "ipt>window.__xss=2;alert(2)</script> <b>bold</b>",
        " see https://example.com/a?b=1 or javascript:alert(3)",
    ]
    async with serve_on_loopback(scripted_backend(chunks)) as (host, port):
        src = f"http://{host}:{port}/widget/v1/kvgate-chat.js"
        await page.goto(env.site.url("kvg_scripted", src=src, open="true"))
        await wait_state(page, "ready")
        await page.evaluate(usage_log_script())
        await send(page, "say something nasty")
        await usages(page, 1)
        await wait_state(page, "ready")
    answer = (await messages(page))[-1]
    assert answer == ("assistant", "".join(chunks))
    made = await shadow(page, "root.querySelectorAll('img, script, b, iframe').length")
    assert made == 0
    assert await page.evaluate("document.querySelectorAll('img').length") == 0
    assert await page.evaluate("window.__xss === undefined")
    assert page.dialogs == []  # type: ignore[attr-defined]
    links = await shadow(page, "[...root.querySelectorAll('.msg a')].map(a => [a.href, a.rel])")
    assert links == [["https://example.com/a?b=1", "noopener noreferrer"]]


async def test_server_error_offers_retry(env: Env, page: Page) -> None:
    async with serve_on_loopback(scripted_backend(["all ", "good"], fail_first=1)) as (host, port):
        src = f"http://{host}:{port}/widget/v1/kvgate-chat.js"
        await page.goto(env.site.url("kvg_scripted", src=src, open="true"))
        await wait_state(page, "ready")
        await send(page, "hello")
        await wait_state(page, "error")
        assert "not answered" in await status_text(page)
        await page.get_by_role("button", name="Retry").click()
        await wait_state(page, "ready")
    assert await messages(page) == [("user", "hello"), ("assistant", "all good")]
    assert await status_text(page) == ""


async def test_keyboard_only_reload_and_new_conversation(env: Env, page: Page) -> None:
    t = await widget_tenant(env.gw, "kbd", [env.site.origin])
    await page.goto(env.site.url(t.widget_key))
    await wait_state(page, "ready")
    await page.evaluate(usage_log_script())
    active = "root.activeElement && (root.activeElement.id || root.activeElement.ariaLabel)"
    await page.keyboard.press("Tab")
    assert await shadow(page, active) == "Open chat"
    outline = await shadow(page, "getComputedStyle(root.activeElement).outlineStyle")
    assert outline == "solid"  # visible focus
    await page.keyboard.press("Enter")
    assert await shadow(page, active) == "kvg-input"
    await page.keyboard.type("first line")
    await page.keyboard.press("Shift+Enter")
    await page.keyboard.type("second line")
    await page.keyboard.press("Enter")
    await usages(page, 1)
    await wait_state(page, "ready")
    convo = await messages(page)
    assert convo[0] == ("user", "first line\nsecond line") and convo[1][0] == "assistant"
    await page.keyboard.press("Escape")
    assert await shadow(page, "root.querySelector('.panel').hidden")
    assert await shadow(page, active) == "Open chat"
    await page.reload()
    await wait_state(page, "ready")
    assert await messages(page) == convo  # the conversation survived the reload
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")
    await page.get_by_role("button", name="New conversation").click()
    assert await messages(page) == []
    await page.reload()
    await wait_state(page, "ready")
    assert await messages(page) == []


async def test_works_under_a_strict_content_security_policy(env: Env, page: Page) -> None:
    t = await widget_tenant(env.gw, "csp", [env.site.origin])
    violations: list[str] = []
    page.on(
        "console", lambda m: violations.append(m.text) if "Content Security" in m.text else None
    )
    await page.goto(env.site.url(t.widget_key, open="true", csp="1"))
    await wait_state(page, "ready")
    await page.evaluate(usage_log_script())
    await send(page, "hi")
    await usages(page, 1)
    await wait_state(page, "ready")
    assert [role for role, _ in await messages(page)] == ["user", "assistant"]
    # The policy is in force (the page's own inline style is refused) ...
    assert await page.evaluate("getComputedStyle(document.querySelector('h1')).fontSize") != "40px"
    # ... and the widget is styled all the same (a constructed, adopted stylesheet).
    width = await shadow(page, "getComputedStyle(root.querySelector('.launcher')).width")
    assert width == "56px"
    assert not [v for v in violations if "kvgate" in v or env.gw.base_url in v], violations


async def test_narrow_viewport_and_dark_mode(env: Env) -> None:
    t = await widget_tenant(env.gw, "narrow", [env.site.origin])
    context = await env.browser.new_context(
        viewport={"width": 320, "height": 640}, color_scheme="dark"
    )
    try:
        page = await context.new_page()
        await page.goto(env.site.url(t.widget_key, open="true"))
        await wait_state(page, "ready")
        box = await page.get_by_role("dialog").bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 320
        assert await page.get_by_role("textbox", name="Message").is_visible()
        assert await page.get_by_role("button", name="Send").is_visible()
        bg = await shadow(page, "getComputedStyle(root.querySelector('.panel')).backgroundColor")
        r, g, b = (int(x) for x in re.findall(r"\d+", bg)[:3])
        assert r + g + b < 150, bg  # dark
    finally:
        await context.close()


async def test_session_tokens_from_the_tenants_backend(env: Env, page: Page) -> None:
    gw, site = env.gw, env.site
    t = await widget_tenant(gw, "sess", [site.origin])
    await gw.admin("PUT", f"/tenants/{t.id}/widget", {"require_session": True})
    site.sessions["s1"] = (t.server_key, 2)  # 2 s tokens
    url = site.url(t.widget_key, open="true", **{"session-url": f"{site.origin}/session/s1"})
    await page.goto(url)
    await wait_state(page, "ready")
    await page.evaluate(usage_log_script())
    await send(page, "hi")
    await usages(page, 1)
    assert site.session_calls["s1"] == 1
    await asyncio.sleep(2.2)  # the first token has expired: the widget gets a new one
    await wait_state(page, "ready")
    await send(page, "again")
    await usages(page, 2)
    assert site.session_calls["s1"] == 2
    chat = f"{gw.base_url}/v1/chat/completions"
    model = gw.state.model_name
    # The bare widget key is refused for this tenant, readably.
    assert await page.evaluate(FETCH_JS, [chat, t.widget_key, model]) == [403, "session_required"]
    # An expired token is refused.
    _, short = await new_session(gw, t.server_key, site.origin, ttl_s=1)
    await asyncio.sleep(1.1)
    expired = await page.evaluate(FETCH_JS, [chat, short["token"], model])
    assert expired == [401, "session_expired"]
    # A token issued for another origin is refused on this one.
    _, other = await new_session(gw, t.server_key, "https://other.example")
    wrong = await page.evaluate(FETCH_JS, [chat, other["token"], model])
    assert wrong == [403, "origin_not_allowed"]
