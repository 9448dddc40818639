"""Admin API: prompt versions carry tools (validated, stored, listed, switched by activation,
audited by name and hash), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tenants.store import TenantStore
from tests.gateway.admin.test_admin import _client, call, error
from tests.tenants.fixtures import db_url, postgresql_url, sqlite_url, store

__all__ = ["db_url", "postgresql_url", "sqlite_url", "store"]

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look an order up by its number.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "integer"}},
            "required": ["order_id"],
        },
    },
    "source": {"webhook": "https://hooks.example.com/orders"},
    "status_text": "Looking up your order...",
}
CLIENT_SIDE = {"type": "function", "function": {"name": "open_page"}}


@pytest.fixture
async def api(store: TenantStore) -> AsyncIterator[TestClient]:
    client = await _client(store)
    yield client
    await client.close()


async def _tenant(api: TestClient) -> None:
    body = {"id": "acme", "name": "Acme", "system_prompt": "version one"}
    await call(api, "POST", "/tenants", 201, json=body)


async def _put(api: TestClient, status: int, **body: Any) -> Any:
    return await call(api, "PUT", "/tenants/acme/system-prompt", status, json=body)


async def test_a_version_keeps_its_tools_and_activation_switches_them(api: TestClient) -> None:
    await _tenant(api)
    out = await _put(api, 200, text="with tools", tools=[LOOKUP, CLIENT_SIDE], max_tool_rounds=2)
    assert out["version"] == 2 and len(out["webhook_secret"]) == 64  # shown this once
    again = await _put(api, 200, text="again", tools=[LOOKUP])
    assert again == {"version": 3}  # the tenant has its secret already
    two = await call(api, "GET", "/tenants/acme/system-prompts/2", 200)
    assert two["tools"] == [LOOKUP, CLIENT_SIDE] and two["max_tool_rounds"] == 2
    assert two["tool_choice"] == "auto"
    listed = await call(api, "GET", "/tenants/acme/system-prompts", 200)
    assert [p["tools"] is None for p in listed["data"]] == [False, False, True]
    await call(api, "POST", "/tenants/acme/system-prompts/1/activate", 200)
    one = await call(api, "GET", "/tenants/acme/system-prompts/1", 200)
    assert one["active"] and one["tools"] is None
    page = await call(api, "GET", "/audit?tenant=acme", 200)
    rows = {r["action"]: r["details"] for r in reversed(page["data"])}
    assert rows["prompt.activate"]["tools"] == []
    assert rows["prompt.set"]["tools"] == ["lookup_order"]
    assert "tool_secret.create" in rows
    text = str(page)
    assert "hooks.example.com" not in text and out["webhook_secret"] not in text


async def test_the_secret_rotates_and_is_never_listed(api: TestClient) -> None:
    await _tenant(api)
    first = (await _put(api, 200, text="t", tools=[LOOKUP]))["webhook_secret"]
    rotated = await call(api, "POST", "/tenants/acme/tool-secret/rotate", 200)
    assert len(rotated["webhook_secret"]) == 64 and rotated["webhook_secret"] != first
    tenant = await call(api, "GET", "/tenants/acme", 200)
    assert first not in str(tenant) and rotated["webhook_secret"] not in str(tenant)


def _with(**fn: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", **fn}}


BAD: list[tuple[Any, str]] = [
    ("not a list", "tools"),
    ([_with(parameters={"type": "array"})], "tools.0.function.parameters"),
    ([_with(parameters={"type": "object", "properties": 3})], "tools.0.function.parameters"),
    ([_with(), _with()], "tools.1.function.name"),
    ([{"type": "function", "function": {"name": "bad name"}}], "tools.0.function.name"),
    ([{"type": "other", "function": {"name": "f"}}], "tools.0.type"),
    ([{**_with(), "source": {"webhook": "ftp://x"}}], "tools.0.source.webhook"),
    ([{**_with(), "source": {"mcp": "srv_nope"}}], "tools.0.source.mcp"),
    ([{**_with(), "status_text": "x" * 201}], "tools.0.status_text"),
    ([_with(description="d" * 4001)], "tools.0.function.description"),
    ([_with(parameters={"type": "object", "description": "x" * 20_000})], "tools.0.function"),
    ([_with(name=f"f{i}") for i in range(65)], "tools"),
    ([{**_with(), "extra": 1}], "tools.0.extra"),
]


@pytest.mark.parametrize(("tools", "param"), BAD)
async def test_malformed_tools_are_400s_naming_the_field(
    api: TestClient, tools: Any, param: str
) -> None:
    await _tenant(api)
    err = error(await _put(api, 400, text="t", tools=tools))
    assert err["code"] == "invalid_tools" and err["param"].startswith(param), err
    versions = await call(api, "GET", "/tenants/acme/system-prompts", 200)
    assert len(versions["data"]) == 1  # nothing was written


async def test_tool_options_are_checked_against_the_tools(api: TestClient) -> None:
    await _tenant(api)
    named = {"type": "function", "function": {"name": "nope"}}
    err = error(await _put(api, 400, text="t", tools=[LOOKUP], tool_choice=named))
    assert err["param"] == "tool_choice.function.name"
    err = error(await _put(api, 400, text="t", tool_choice="required"))
    assert err["param"] == "tool_choice"
    err = error(await _put(api, 400, text="t", tools=[LOOKUP], max_tool_rounds=99))
    assert err["param"] == "max_tool_rounds"
    ok = await _put(api, 200, text="t", tools=[LOOKUP], tool_choice="required")
    got = await call(api, "GET", f"/tenants/acme/system-prompts/{ok['version']}", 200)
    assert got["tool_choice"] == "required" and got["max_tool_rounds"] == 4
