"""The console's Policies tab in Chromium: a platform editor turns a tenant's policies (client
system messages, stored conversations and their retention, a cache salt per visitor on vLLM)
and the admin API holds what was saved; a tenant editor sees them, unchangeable."""

from __future__ import annotations

import pytest

from tests.console.console import Env, new_token, settle, sign_in, tid, watched_page
from tests.gateway.harness import ADMIN_TOKEN

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_a_platform_editor_saves_policies_a_tenant_editor_reads_them(env: Env) -> None:
    gw = env.gw
    t = await gw.create_tenant(tid("pol"))
    before = await gw.admin("GET", f"/tenants/{t.id}")
    assert before["conversation_store"] and not before["vllm_visitor_salt"]
    async with watched_page(env.browser) as w:
        page = w.page
        await sign_in(page, gw, ADMIN_TOKEN)
        await page.goto(f"{gw.base_url}/admin/ui/#/tenants/{t.id}/policies")
        await settle(page)
        await page.get_by_label("Store conversations").uncheck()
        await page.get_by_label("Conversation retention (days)").fill("30")
        await page.get_by_label("A cache salt per visitor on vLLM").check()
        await page.get_by_role("button", name="Save policies").click()
        await page.get_by_text("Policies saved").wait_for()
        await settle(page)
        assert await page.get_by_label("Conversation retention (days)").input_value() == "30"
        assert await page.get_by_label("A cache salt per visitor on vLLM").is_checked()
        await page.screenshot(path=env.shots / "console-policies.png", full_page=True)
        w.check_clean()
    after = await gw.admin("GET", f"/tenants/{t.id}")
    assert (after["conversation_store"], after["conversation_retention_days"]) == (False, 30)
    assert after["vllm_visitor_salt"] and after["allow_client_system"]
    audit = await gw.admin("GET", f"/tenants/{t.id}/audit?limit=10")
    assert audit["data"][0]["action"] == "tenant.update"

    editor = await new_token(gw, t.id, "editor")
    async with watched_page(env.browser) as w:
        page = w.page
        await sign_in(page, gw, editor)
        await page.goto(f"{gw.base_url}/admin/ui/#/tenants/{t.id}/policies")
        await settle(page)
        assert await page.get_by_label("A cache salt per visitor on vLLM").is_disabled()
        assert await page.get_by_role("button", name="Save policies").count() == 0
        await page.get_by_text("Platform editors change these.").wait_for()
        w.check_clean()
