"""The console and a prompt version's tools: it shows a version's tools, tool choice and rounds,
a text edit saved as a new version keeps them (the version is sent whole), a tools edit is saved
as made, the diff between versions names the tool changes, and saving a version without the
tools the active one has asks first."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.console.console import Env, settle, sign_in, tid, watched_page
from tests.gateway.chat.tools.tenant.test_admin_tools import CLIENT_SIDE, LOOKUP
from tests.gateway.harness import ADMIN_TOKEN, LiveGateway

pytestmark = pytest.mark.asyncio(loop_scope="module")
NAMED = {"type": "function", "function": {"name": "lookup_order"}}
SHIP = {"type": "function", "function": {"name": "ship_order", "description": "Ship it."}}


async def prefix_tokens(gw: LiveGateway, tenant: str, version: int) -> int:
    """The cache card's prompt tokens once ``version`` is the pinned one."""
    for _ in range(200):
        cache = await gw.admin("GET", f"/tenants/{tenant}/cache")
        if cache["prompt_version"] == version:
            tokens: int = cache["prefix_tokens"]
            return tokens
        await asyncio.sleep(0.05)
    raise AssertionError(f"version {version} was never pinned")


async def save(page: Any, version: int) -> None:
    await page.get_by_role("button", name="Save as new version").click()
    await page.wait_for_selector(f"text=Active: version {version}")
    await settle(page)


async def test_tools_are_shown_kept_edited_and_diffed(env: Env) -> None:
    gw, tenant = env.gw, tid("tools")
    await gw.admin("POST", "/tenants", {"id": tenant, "name": "Tools", "system_prompt": "v1"})
    version = {"text": "Orders desk.", "tools": [LOOKUP, CLIENT_SIDE], "tool_choice": NAMED}
    await gw.admin("PUT", f"/tenants/{tenant}/system-prompt", {**version, "max_tool_rounds": 2})
    with_tools = await prefix_tokens(gw, tenant, 2)
    async with watched_page(env.browser) as w:
        page = w.page
        await sign_in(page, gw, ADMIN_TOKEN)
        await page.goto(f"{gw.base_url}/admin/ui/#/tenants/{tenant}/prompt")
        await page.wait_for_selector("#prompt-tools")
        await settle(page)
        assert json.loads(await page.get_by_label("Tools (JSON)").input_value()) == [
            LOOKUP,
            CLIENT_SIDE,
        ]
        assert await page.get_by_label("Tool choice").input_value() == "function lookup_order"
        assert await page.get_by_label("Max tool rounds").input_value() == "2"
        assert "lookup_order, open_page" in await page.locator("#ph-title + table").inner_text()

        await page.get_by_label("System prompt", exact=True).fill("Orders desk, edited.")
        await save(page, 3)  # the text alone edited
        edited = await gw.admin("GET", f"/tenants/{tenant}/system-prompts/3")
        assert edited["tools"] == [LOOKUP, CLIENT_SIDE] and edited["tool_choice"] == NAMED
        assert edited["max_tool_rounds"] == 2
        assert abs(await prefix_tokens(gw, tenant, 3) - with_tools) < 8  # tools still pinned

        changed = {**LOOKUP, "function": {**LOOKUP["function"], "description": "Find one."}}
        await page.get_by_label("Tools (JSON)").fill(json.dumps([changed, SHIP]))
        await page.get_by_label("Tools (JSON)").press("Tab")  # its change lists the choices
        await page.get_by_label("Tool choice").select_option("function ship_order")
        await page.get_by_label("Max tool rounds").fill("3")
        await save(page, 4)
        four = await gw.admin("GET", f"/tenants/{tenant}/system-prompts/4")
        assert four["tools"] == [changed, SHIP] and four["max_tool_rounds"] == 3
        assert four["tool_choice"] == {"type": "function", "function": {"name": "ship_order"}}

        await page.select_option("#diff-from", "3")
        await page.select_option("#diff-to", "4")
        lines = page.locator("#diff-tools")
        assert await lines.locator(".add .line").all_inner_texts() == ["tool ship_order"]
        assert await lines.locator(".del .line").all_inner_texts() == ["tool open_page"]
        assert await lines.locator(".chg .line").all_inner_texts() == [
            "tool lookup_order changed",
            "tool choice: function lookup_order → function ship_order",
            "max tool rounds: 2 → 3",
        ]
        await page.select_option("#diff-from", "2")
        await page.select_option("#diff-to", "3")
        assert await lines.inner_text() == "Tools, tool choice and rounds unchanged"
        await page.screenshot(path=env.shots / "console-prompt-tools.png", full_page=True)

        await page.get_by_label("Tools (JSON)").fill("[]")
        await page.get_by_role("button", name="Save as new version").click()
        await page.get_by_role("button", name="Cancel").click()  # "... will have none"?
        await settle(page)
        listed = await gw.admin("GET", f"/tenants/{tenant}/system-prompts")
        assert len(listed["data"]) == 4  # not saved
        await page.get_by_label("Tools (JSON)").fill("[not json")
        await page.get_by_role("button", name="Save as new version").click()
        assert "not valid JSON" in await page.locator("#error").inner_text()
        w.check_clean()
