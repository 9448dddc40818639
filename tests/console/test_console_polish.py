"""The console's edges: ``/admin/ui`` redirects to ``/admin/ui/``, the audit log fits a 1280-pixel
window (long details wrap inside their card), and the normal sign-in flow logs nothing to the
browser console (no 401 for the session probe before sign-in, no missing icon)."""

from __future__ import annotations

import pytest

from tests.console.console import Env, settle, sign_in, tid, watched_page
from tests.gateway.chat.tools.tenant.test_admin_tools import LOOKUP
from tests.gateway.harness import ADMIN_TOKEN

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_console_without_its_slash_redirects(env: Env) -> None:
    gw = env.gw
    url = f"{gw.base_url}/admin/ui"
    async with gw.http.get(url, allow_redirects=False) as resp:
        assert resp.status == 308 and resp.headers["Location"] == "/admin/ui/"
    async with gw.http.get(f"{url}?x=1", allow_redirects=False) as resp:
        assert resp.headers["Location"] == "/admin/ui/?x=1"
    async with watched_page(env.browser, refusals_are_errors=True) as w:
        await w.page.goto(url)
        await w.page.wait_for_selector("#sign-in:not([hidden])")
        assert w.page.url == f"{url}/"
        w.check_clean()


async def test_the_normal_sign_in_flow_logs_no_console_error(env: Env) -> None:
    gw, tenant = env.gw, tid("flow")
    await gw.admin("POST", "/tenants", {"id": tenant, "name": "Flow", "system_prompt": "Hi."})
    async with watched_page(env.browser, refusals_are_errors=True) as w:
        page = w.page
        messages: list[str] = []
        page.on("console", lambda msg: messages.append(f"{msg.type}: {msg.text}"))
        await sign_in(page, gw, ADMIN_TOKEN)  # first visit, the session probe, then sign-in
        await page.wait_for_selector("#tenant-list table")
        await page.click(f"a[href='#/tenants/{tenant}']")
        await page.wait_for_selector("#prompt-text")
        await settle(page)
        await page.reload()  # a reload asks the session again, signed in this time
        await page.wait_for_selector("#who:not(:empty)")
        await settle(page)
        await page.get_by_role("button", name="Sign out").click()
        await page.wait_for_selector("#sign-in:not([hidden])")
        await page.reload()  # and once more, signed out
        await page.wait_for_selector("#sign-in:not([hidden])")
        await settle(page)
        assert [m for m in messages if m.startswith(("error", "warning"))] == []
        w.check_clean()


async def test_the_audit_log_fits_a_1280_pixel_window(env: Env) -> None:
    gw, tenant = env.gw, tid("audit")
    await gw.admin("POST", "/tenants", {"id": tenant, "name": "Audit", "system_prompt": "v1"})
    named = [{**LOOKUP, "function": {**LOOKUP["function"], "name": f"tool_{i}"}} for i in (1, 2)]
    long = {"text": "x" * 300, "tools": named}  # details: hashes, names, long unbroken JSON
    await gw.admin("PUT", f"/tenants/{tenant}/system-prompt", long)
    async with watched_page(env.browser, width=1280) as w:
        page = w.page
        await sign_in(page, gw, ADMIN_TOKEN)
        await page.goto(f"{gw.base_url}/admin/ui/#/tenants/{tenant}/audit")
        await page.wait_for_selector("#a-title + table")
        await settle(page)
        fits = await page.evaluate(
            """() => {
              const card = document.querySelector('#a-title').closest('.card');
              const table = card.querySelector('table');
              return [document.documentElement.scrollWidth, window.innerWidth,
                      table.getBoundingClientRect().right, card.getBoundingClientRect().right];
            }"""
        )
        page_width, window_width, table_right, card_right = fits
        assert page_width <= window_width, fits  # nothing wider than the window
        assert table_right <= card_right + 0.5, fits  # the table inside its card
        await page.screenshot(path=env.shots / "console-audit-1280.png", full_page=True)
        w.check_clean()
