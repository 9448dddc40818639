"""A new prompt version carries forward the tools, tool choice and rounds its body omits; an
explicit ``tools: []`` (or null) clears them; the audit row says what was carried and from which
version; a version made meanwhile by another writer is never overwritten by what was carried
from its predecessor. On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tenants.carry import prepare_version
from tenants.errors import PromptChanged
from tenants.store import TenantStore
from tenants.tool_service import ToolStore
from tests.gateway.admin.test_admin import _client, call, error
from tests.gateway.chat.tools.tenant.test_admin_tools import CLIENT_SIDE, LOOKUP
from tests.tenants.fixtures import db_url, postgresql_url, sqlite_url, store

__all__ = ["db_url", "postgresql_url", "sqlite_url", "store"]

NAMED = {"type": "function", "function": {"name": "lookup_order"}}
WITH_TOOLS = {"tools": [LOOKUP, CLIENT_SIDE], "tool_choice": NAMED, "max_tool_rounds": 2}


@pytest.fixture
async def api(store: TenantStore) -> AsyncIterator[TestClient]:
    client = await _client(store)
    await call(client, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme"})
    await call(client, "PUT", "/tenants/acme/system-prompt", 200, json={"text": "v1"})
    yield client
    await client.close()


async def _put(api: TestClient, status: int, **body: Any) -> Any:
    return await call(api, "PUT", "/tenants/acme/system-prompt", status, json=body)


async def _version(api: TestClient, version: int) -> Any:
    return await call(api, "GET", f"/tenants/acme/system-prompts/{version}", 200)


async def _set_rows(api: TestClient) -> dict[int, dict[str, Any]]:
    """The details of every ``prompt.set`` audit row, by version."""
    page = await call(api, "GET", "/audit?tenant=acme", 200)
    rows = [r["details"] for r in page["data"] if r["action"] == "prompt.set"]
    return {r["version"]: r for r in rows}


async def test_a_version_that_omits_its_tools_keeps_the_active_ones(api: TestClient) -> None:
    await _put(api, 200, text="with tools", **WITH_TOOLS)
    assert await _put(api, 200, text="text edited") == {"version": 3}
    edited = await _version(api, 3)
    assert edited["text"] == "text edited" and edited["active"]
    assert edited["tools"] == [LOOKUP, CLIENT_SIDE]
    assert edited["tool_choice"] == NAMED and edited["max_tool_rounds"] == 2
    audit = await _set_rows(api)
    assert audit[3]["carried"] == ["tools", "tool_choice", "max_tool_rounds"]
    assert audit[3]["carried_from"] == 2 and audit[3]["tools"] == ["lookup_order", "open_page"]
    assert "carried" not in audit[2]  # sent whole: nothing carried
    await _put(api, 200, text="fewer rounds", max_tool_rounds=1)  # the others carried
    four = await _version(api, 4)
    assert four["tools"] == [LOOKUP, CLIENT_SIDE] and four["max_tool_rounds"] == 1
    assert (await _set_rows(api))[4]["carried"] == ["tools", "tool_choice"]


async def test_empty_tools_clear_them_and_null_asks_for_the_default(api: TestClient) -> None:
    await _put(api, 200, text="with tools", **WITH_TOOLS)
    err = error(await _put(api, 400, text="no tools", tools=[]))  # the carried choice names one
    assert err["param"] == "tool_choice.function.name" and err["code"] == "invalid_tools"
    assert "carried from version 2" in err["message"]
    await _put(api, 200, text="no tools", tools=[], tool_choice="auto")
    cleared = await _version(api, 3)
    assert cleared["tools"] is None and cleared["tool_choice"] == "auto"
    assert cleared["max_tool_rounds"] == 2  # carried
    await _put(api, 200, text="defaults", tools=None, tool_choice=None, max_tool_rounds=None)
    defaults = await _version(api, 4)
    assert (defaults["tools"], defaults["tool_choice"], defaults["max_tool_rounds"]) == (
        None,
        "auto",
        4,
    )
    assert "carried" not in (await _set_rows(api))[4]


async def test_activating_a_version_then_editing_carries_that_version(api: TestClient) -> None:
    await _put(api, 200, text="with tools", **WITH_TOOLS)
    await _put(api, 200, text="without", tools=[], tool_choice="auto")
    await call(api, "POST", "/tenants/acme/system-prompts/2/activate", 200)
    await _put(api, 200, text="edited after rollback")
    assert (await _version(api, 4))["tools"] == [LOOKUP, CLIENT_SIDE]
    assert (await _set_rows(api))[4]["carried_from"] == 2


async def test_a_version_made_meanwhile_is_not_overwritten(store: TenantStore) -> None:
    api = await _client(store)
    try:
        await call(api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme"})
        await _put(api, 200, text="with tools", **WITH_TOOLS)
        tools = ToolStore(store)
        active = await tools.active_version("acme")
        data, carry = prepare_version({"text": "carried"}, active)  # read: version 1
        await _put(api, 200, text="another writer", tools=[CLIENT_SIDE], tool_choice="auto")
        with pytest.raises(PromptChanged, match=r"version 1 -> 2"):
            await tools.set_prompt("acme", data, actor="admin", carry=carry)
        assert len((await call(api, "GET", "/tenants/acme/system-prompts", 200))["data"]) == 2
        sent_whole = {"text": "whole", "tools": [], "tool_choice": "auto", "max_tool_rounds": 4}
        data, carry = prepare_version(sent_whole, active)  # nothing carried: last writer wins
        assert (await tools.set_prompt("acme", data, actor="admin", carry=carry)).version == 3
    finally:
        await api.close()
