"""The console's Transcripts tab in Chromium: a viewer lists a tenant's conversations and reads
one (hostile text shown as text), with no way to delete; an editor deletes one and turns
transcript access off, after which the page says why nothing is listed."""

from __future__ import annotations

import pytest
from playwright.async_api import Page

from tests.console.console import Env, new_token, settle, sign_in, watched_page
from tests.gateway.admin.test_transcripts import ORIGIN, visitor_conversation
from tests.widget.helpers import widget_tenant

pytestmark = pytest.mark.asyncio(loop_scope="module")
MARKUP = '<img src=x onerror="alert(1)"><b id="injected">bold</b>'


async def open_tab(page: Page, env: Env, tenant: str, sub: str = "") -> None:
    path = f"#/tenants/{tenant}/transcripts" + (f"/{sub}" if sub else "")
    await page.goto(f"{env.gw.base_url}/admin/ui/{path}")
    await settle(page)


async def test_viewer_reads_editor_deletes_and_turns_access_off(env: Env) -> None:
    gw = env.gw
    t = await widget_tenant(gw, "tr-console", [ORIGIN])
    await gw.admin("PUT", f"/tenants/{t.id}/widget", {"history": True})
    conv = await visitor_conversation(gw, t.server_key, "erin", f"Hello {MARKUP}")
    viewer = await new_token(gw, t.id, "viewer")
    async with watched_page(env.browser) as w:
        page = w.page
        await sign_in(page, gw, viewer)
        await open_tab(page, env, t.id)
        table = page.locator("#tab table")
        await table.wait_for()
        cells = await table.locator("tbody tr").first.locator("td").all_inner_texts()
        assert cells[0] == "erin" and cells[2] == "1" and int(cells[3]) > 0
        assert cells[4].startswith("$")
        await page.get_by_role("link", name="Read the conversation of erin", exact=False).click()
        await page.wait_for_selector("#transcript")
        await settle(page)
        turns = await page.locator("#transcript li .text").all_inner_texts()
        assert turns[0] == f"Hello {MARKUP}" and len(turns) == 2
        assert await page.locator("#injected, #view img").count() == 0
        assert await page.get_by_role("button", name="Delete conversation").count() == 0
        assert await page.locator("#t-access").count() == 0  # viewers do not see the switch
        await page.screenshot(path=env.shots / "console-transcript.png", full_page=True)
        w.check_clean()
    audit = await gw.admin("GET", f"/tenants/{t.id}/audit?limit=50")
    actions = [a["action"] for a in audit["data"]]
    assert "transcripts.read" in actions and "transcripts.list" in actions

    editor = await new_token(gw, t.id, "editor")
    async with watched_page(env.browser) as w:
        page = w.page
        await sign_in(page, gw, editor)
        await open_tab(page, env, t.id, conv)
        await page.wait_for_selector("#transcript")
        await page.get_by_role("button", name="Delete conversation").click()
        await page.locator("#confirm-ok").click()
        await page.wait_for_function("() => location.hash.endsWith('/transcripts')")
        await settle(page)
        await page.get_by_text("No stored conversations.").wait_for()
        await page.get_by_label("Operators may read this tenant's transcripts").uncheck()
        await page.get_by_role("button", name="Save transcript access").click()
        await settle(page)
        await page.wait_for_selector("#error:not([hidden])")
        assert "transcript access is turned off" in await page.locator("#error").inner_text()
        assert await page.locator("#tab table").count() == 0
        w.check_clean()
    assert (await gw.admin("GET", f"/tenants/{t.id}/transcript-access")) == {"enabled": False}
