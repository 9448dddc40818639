"""The admin console in Debian's Chromium (headless) against a live gateway on loopback
(fixtures: tests/console/conftest.py)."""

from __future__ import annotations

import asyncio

import pytest
from playwright.async_api import Page

from gateway.admin import ADMIN_SESSIONS
from tests.console.console import Env, fetch, new_token, settle, sign_in, tid, watched_page
from tests.gateway.harness import (
    ADMIN_TOKEN,
    LiveGateway,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")
MARKUP = '<img src=x onerror="alert(1)"><script>alert(2)</script><b id="injected">bold</b>'


async def wait_for_usage(gw: LiveGateway, tenant: str, timeout: float = 30.0) -> None:
    """Until the ledger reports the tenant's request (recorded after the response, batched)."""
    async with asyncio.timeout(timeout):
        while not (await gw.admin("GET", f"/tenants/{tenant}/usage?group_by=hour"))["data"]:
            await asyncio.sleep(0.1)


async def no_injected_elements(page: Page) -> None:
    found = await page.evaluate(
        "() => [...document.querySelectorAll('#view img, #view script, #injected')].length"
    )
    assert found == 0


async def test_editor_creates_a_tenant_edits_diffs_and_rolls_back(env: Env) -> None:
    gw, tenant = env.gw, tid("shop")
    async with watched_page(env.browser) as w:
        page = w.page
        await page.goto(f"{gw.base_url}/admin/ui/")
        await page.screenshot(path=env.shots / "console-sign-in.png")
        await sign_in(page, gw, ADMIN_TOKEN)
        await page.get_by_label("Tenant id").fill(tenant)
        await page.get_by_label("Name").fill(f"Shop {MARKUP}")
        await page.get_by_label("System prompt (optional)").fill(f"Version one.\n{MARKUP}")
        await page.get_by_role("button", name="Create tenant").click()
        await page.wait_for_selector(f"a[href='#/tenants/{tenant}']")
        await settle(page)
        assert MARKUP in await page.locator("#tenant-list").inner_text()
        await no_injected_elements(page)
        await page.screenshot(path=env.shots / "console-tenants.png", full_page=True)
        stored = await page.evaluate("() => [localStorage.length, sessionStorage.length]")
        assert stored == [0, 0]  # the token is exchanged for a cookie, kept nowhere
        assert "kvgate_admin" not in await page.evaluate("() => document.cookie")  # HttpOnly
        await page.get_by_label("Tenant id").fill(tenant)  # again: the API's message shows
        await page.get_by_label("Name").fill("Twice")
        await page.get_by_role("button", name="Create tenant").click()
        await page.wait_for_selector("#error:not([hidden])")
        assert "already exists" in await page.locator("#error").inner_text()
        await page.click(f"a[href='#/tenants/{tenant}']")
        await page.wait_for_selector("#prompt-text")
        await settle(page)
        for n, text in ((2, "Version two.\nshared line"), (3, "Version three.\nshared line")):
            await page.get_by_label("System prompt", exact=True).fill(text)
            await page.get_by_role("button", name="Save as new version").click()
            await page.wait_for_selector(f"text=Active: version {n}")
            await settle(page)
        await page.select_option("#diff-from", "1")
        await page.select_option("#diff-to", "3")
        assert await page.locator("#diff-out .add .line").all_inner_texts() == [
            "Version three.",
            "shared line",
        ]
        assert "Version one." in await page.locator("#diff-out .del .line").all_inner_texts()
        await no_injected_elements(page)
        await page.screenshot(path=env.shots / "console-prompt.png", full_page=True)
        await page.get_by_role("button", name="Activate version 1").click()
        await page.get_by_role("button", name="Activate", exact=True).click()  # confirm
        await page.wait_for_selector("text=Active: version 1")
        got = await gw.admin("GET", f"/tenants/{tenant}")
        assert got["prompt_version"] == 1
        w.check_clean()


async def test_widget_key_is_shown_once(env: Env) -> None:
    gw, tenant = env.gw, tid("keys")
    await gw.admin("POST", "/tenants", {"id": tenant, "name": "Keys"})
    async with watched_page(env.browser) as w:
        page = w.page
        await sign_in(page, gw, ADMIN_TOKEN)
        await page.goto(f"{gw.base_url}/admin/ui/#/tenants/{tenant}/keys")
        await page.wait_for_selector("#key-kind")
        await page.select_option("#key-kind", "widget")
        await page.get_by_label("Allowed origins (widget keys)").fill("https://shop.example")
        await page.get_by_role("button", name="Create key").click()
        key = await page.locator("#new-key").inner_text()
        assert key.startswith("kvg_")
        await settle(page)
        await page.screenshot(path=env.shots / "console-keys.png", full_page=True)
        keys = await gw.admin("GET", f"/tenants/{tenant}/keys")
        assert [k["kind"] for k in keys["data"]] == ["widget"]
        await page.reload()
        await page.wait_for_selector("#key-kind")
        await settle(page)
        assert key not in await page.content()  # shown once: not after a reload
        w.check_clean()


async def test_tenant_admin_sees_only_its_tenant(env: Env) -> None:
    gw, mine, other = env.gw, tid("mine"), tid("other")
    for t in (mine, other):
        await gw.admin("POST", "/tenants", {"id": t, "name": t, "system_prompt": "Hello."})
    token = await new_token(gw, mine, "editor")
    async with watched_page(env.browser, width=768) as w:
        page = w.page
        await sign_in(page, gw, token)
        await page.wait_for_selector("#prompt-text")
        assert await page.locator("#tenant-name").inner_text() == mine
        assert not await page.locator("#nav").is_visible()
        width = await page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 768  # readable at 768 px: nothing wider than the window
        await page.screenshot(path=env.shots / "console-tenant-768.png", full_page=True)
        assert await fetch(page, "GET", "/tenants") == [403, "platform_admin_required"]
        assert await fetch(page, "GET", f"/tenants/{other}") == [404, "tenant_not_found"]
        await page.goto(f"{gw.base_url}/admin/ui/#/tenants/{other}")
        await page.wait_for_selector("#error:not([hidden])")
        assert "not found" in await page.locator("#error").inner_text()
        assert other not in await page.locator("#view").inner_text()
        w.check_clean()


async def test_viewer_cannot_write(env: Env) -> None:
    gw, tenant = env.gw, tid("view")
    await gw.admin("POST", "/tenants", {"id": tenant, "name": "View", "system_prompt": "Hi."})
    token = await new_token(gw, "platform", "viewer")
    async with watched_page(env.browser) as w:
        page = w.page
        await sign_in(page, gw, token)
        await page.wait_for_selector("#tenant-list table")
        assert await page.get_by_role("button", name="Create tenant").count() == 0
        assert await page.get_by_role("button", name=f"Delete {tenant}").count() == 0
        await page.goto(f"{gw.base_url}/admin/ui/#/tenants/{tenant}")
        await page.wait_for_selector("#prompt-text")
        await settle(page)
        assert await page.locator("#prompt-save").count() == 0
        assert await page.locator("#prompt-text").get_attribute("readonly") is not None
        body = {"text": "changed"}
        path = f"/tenants/{tenant}/system-prompt"
        assert await fetch(page, "PUT", path, body) == [403, "read_only"]
        await page.get_by_role("button", name="Sign out").click()  # viewers may sign out
        await page.wait_for_selector("#sign-in:not([hidden])")
        status = await page.evaluate("async () => (await fetch('/admin/v1/session')).status")
        assert status == 401
        w.check_clean()
    assert (await gw.admin("GET", f"/tenants/{tenant}"))["prompt_version"] == 1


async def test_a_write_without_csrf_fails(env: Env) -> None:
    gw, tenant = env.gw, tid("csrf")
    await gw.admin("POST", "/tenants", {"id": tenant, "name": "Before"})
    async with watched_page(env.browser) as w:
        await sign_in(w.page, gw, ADMIN_TOKEN)
        path, body = f"/tenants/{tenant}", {"name": "After"}
        assert await fetch(w.page, "PATCH", path, body, csrf=False) == [403, "csrf_failed"]
        assert (await gw.admin("GET", path))["name"] == "Before"
        assert await fetch(w.page, "PATCH", path, body) == [200, None]
        w.check_clean()


async def test_an_expired_session_goes_back_to_sign_in(env: Env) -> None:
    gw, tenant = env.gw, tid("exp")
    await gw.admin("POST", "/tenants", {"id": tenant, "name": "Exp"})
    async with watched_page(env.browser) as w:
        page = w.page
        await sign_in(page, gw, ADMIN_TOKEN)
        await page.wait_for_selector("#tenant-list table")
        await gw.app[ADMIN_SESSIONS].expire_all()
        await page.click(f"a[href='#/tenants/{tenant}']")
        await page.wait_for_selector("#sign-in:not([hidden])")
        assert "sign in again" in await page.locator("#error").inner_text()
        assert await page.locator("#view").inner_text() == ""
        w.check_clean()


async def test_usage_audit_and_cluster_pages_render(env: Env) -> None:
    gw, tenant = env.gw, tid("pages")
    await gw.admin("POST", "/tenants", {"id": tenant, "name": "Pages", "system_prompt": "Hi."})
    key = (await gw.admin("POST", f"/tenants/{tenant}/keys", {"kind": "server"}))["key"]
    client = gw.openai(key)
    await client.chat.completions.create(
        model=gw.state.model_name, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )
    await wait_for_usage(gw, tenant)
    async with watched_page(env.browser) as w:
        page = w.page
        await sign_in(page, gw, ADMIN_TOKEN)
        for tab, marker, shot in (
            ("usage", "#usage-out", "console-usage.png"),
            ("audit", "#a-title", "console-audit.png"),  # the create row, by the bootstrap
            ("limits", "#tlim-title", "console-limits.png"),
            ("widget", "#w-title", None),
        ):
            await page.goto(f"{gw.base_url}/admin/ui/#/tenants/{tenant}/{tab}")
            await page.wait_for_selector(marker)
            await settle(page)
            if shot:
                await page.screenshot(path=env.shots / shot, full_page=True)
            if tab == "usage":
                assert await page.locator("svg.chart rect").count() >= 1
        await page.goto(f"{gw.base_url}/admin/ui/#/cluster")
        await page.wait_for_selector("#c-title")
        await page.goto(f"{gw.base_url}/admin/ui/#/admins")
        await page.wait_for_selector("#al-title")
        await settle(page)
        w.check_clean()


async def test_keyboard_alone_reaches_every_page(env: Env) -> None:
    """Signed in with the keyboard (sign_in presses Enter), Shift+Tab reaches the navigation and
    Enter follows it; every form control of the tenant page has an accessible name."""
    gw, tenant = env.gw, tid("kbd")
    await gw.admin("POST", "/tenants", {"id": tenant, "name": "Keys"})
    async with watched_page(env.browser) as w:
        page = w.page
        await sign_in(page, gw, ADMIN_TOKEN)
        await page.wait_for_selector("#tenant-list table")
        for _ in range(10):  # the console focuses <main> on each page: back up to the nav
            await page.keyboard.press("Shift+Tab")
            if await page.evaluate("() => document.activeElement.textContent") == "Cluster":
                break
        await page.keyboard.press("Enter")
        await page.wait_for_selector("#c-title")
        await page.goto(f"{gw.base_url}/admin/ui/#/tenants/{tenant}/widget")
        await page.wait_for_selector("#w-title")
        await settle(page)
        unnamed = await page.evaluate(
            """() => [...document.querySelectorAll('input, select, textarea, button')]
                 .filter(e => e.offsetParent !== null)
                 .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')
                              && !e.textContent.trim())
                 .map(e => e.outerHTML)"""
        )
        assert unnamed == []
        w.check_clean()
