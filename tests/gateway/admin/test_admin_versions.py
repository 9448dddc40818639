"""Admin API: prompt versions (show, activate), key listing and per-key limits, on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tenants.events import TenantChanged
from tenants.store import TenantStore
from tests.gateway.admin.test_admin import _client, call, error
from tests.tenants.fixtures import db_url, postgresql_url, sqlite_url, store

__all__ = ["db_url", "postgresql_url", "sqlite_url", "store"]


@pytest.fixture
async def api(store: TenantStore) -> AsyncIterator[TestClient]:
    client = await _client(store)
    yield client
    await client.close()


@pytest.fixture
def events(store: TenantStore) -> list[TenantChanged]:
    seen: list[TenantChanged] = []

    async def listen(event: TenantChanged) -> None:
        seen.append(event)

    store.bus.subscribe(listen)
    return seen


async def _tenant_with_versions(api: TestClient, n: int) -> None:
    body = {"id": "acme", "name": "Acme", "system_prompt": "version one"}
    await call(api, "POST", "/tenants", 201, json=body)
    for i in range(2, n + 1):
        await call(api, "PUT", "/tenants/acme/system-prompt", 200, json={"text": f"version {i}"})


async def _actions(api: TestClient) -> list[tuple[str, dict[str, Any]]]:
    page = await call(api, "GET", "/audit?tenant=acme", 200)
    return [(row["action"], row["details"]) for row in reversed(page["data"])]


async def test_show_one_version(api: TestClient) -> None:
    await _tenant_with_versions(api, 2)
    one = await call(api, "GET", "/tenants/acme/system-prompts/1", 200)
    assert one["version"] == 1 and one["text"] == "version one" and one["active"] is False
    two = await call(api, "GET", "/tenants/acme/system-prompts/2", 200)
    assert two["active"] is True and two["created_by"] == "admin"
    err = error(await call(api, "GET", "/tenants/acme/system-prompts/3", 404))
    assert err["code"] == "prompt_version_not_found" and err["param"] == "version"
    err = error(await call(api, "GET", "/tenants/nope/system-prompts/1", 404))
    assert err["code"] == "tenant_not_found"
    for bad in ("0", "abc", "-1", "99999999999", "1.5", "٣"):
        err = error(await call(api, "GET", f"/tenants/acme/system-prompts/{bad}", 422))
        assert err["param"] == "version"


async def test_rollback_and_roll_forward(
    api: TestClient, store: TenantStore, events: list[TenantChanged]
) -> None:
    await _tenant_with_versions(api, 3)
    events.clear()
    out = await call(api, "POST", "/tenants/acme/system-prompts/1/activate", 200)
    assert out == {"version": 1, "previous_version": 3, "changed": True}
    assert (await call(api, "GET", "/tenants/acme", 200))["prompt_version"] == 1
    listed = await call(api, "GET", "/tenants/acme/system-prompts", 200)
    assert [(p["version"], p["active"]) for p in listed["data"]] == [
        (3, False),
        (2, False),
        (1, True),
    ]
    assert events == [TenantChanged("acme", "prompt", 1)]
    await store.check_integrity()

    # Activating the active version changes nothing: no audit row, no event.
    again = await call(api, "POST", "/tenants/acme/system-prompts/1/activate", 200)
    assert again == {"version": 1, "previous_version": 1, "changed": False}
    assert len(events) == 1

    # A new version after a rollback is numbered after the newest, not the active one.
    new = await call(api, "PUT", "/tenants/acme/system-prompt", 200, json={"text": "version 4"})
    assert new == {"version": 4}
    forward = await call(api, "POST", "/tenants/acme/system-prompts/2/activate", 200)
    assert forward == {"version": 2, "previous_version": 4, "changed": True}
    await store.check_integrity()

    activations = [d for a, d in await _actions(api) if a == "prompt.activate"]
    assert [(d["version"], d["previous_version"]) for d in activations] == [(1, 3), (2, 4)]
    assert all(len(d["sha256"]) == 64 and "text" not in d for d in activations)


async def test_activate_errors(api: TestClient) -> None:
    await _tenant_with_versions(api, 1)
    err = error(await call(api, "POST", "/tenants/acme/system-prompts/7/activate", 404))
    assert err["code"] == "prompt_version_not_found"
    err = error(await call(api, "POST", "/tenants/ghost/system-prompts/1/activate", 404))
    assert err["code"] == "tenant_not_found"
    await call(api, "DELETE", "/tenants/acme", 200)
    err = error(await call(api, "POST", "/tenants/acme/system-prompts/1/activate", 409))
    assert err["code"] == "tenant_deleted"
    assert [a for a, _ in await _actions(api)] == ["tenant.create", "tenant.delete"]


async def test_keys_with_limits(
    api: TestClient, store: TenantStore, events: list[TenantChanged]
) -> None:
    await call(api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme"})
    body = {
        "kind": "widget",
        "allowed_origins": ["https://shop.example"],
        "limits": {"rpm": 10, "max_concurrency": 2},
    }
    created = await call(api, "POST", "/tenants/acme/keys", 201, json=body)
    assert created["limits"] == {"rpm": 10, "tpm": None, "max_concurrency": 2}
    plain = await call(api, "POST", "/tenants/acme/keys", 201, json={"kind": "server"})
    assert plain["limits"] == {"rpm": None, "tpm": None, "max_concurrency": None}

    listed = (await call(api, "GET", "/tenants/acme/keys", 200))["data"]
    assert [k["id"] for k in listed] == [created["id"], plain["id"]]
    assert listed[0]["limits"] == created["limits"]
    for k in listed:
        assert "key" not in k and "secret_sha256" not in k
        assert created["key"] not in str(k) and plain["key"] not in str(k)

    events.clear()
    path = f"/tenants/acme/keys/{plain['id']}/limits"
    out = await call(api, "PUT", path, 200, json={"tpm": 500})
    assert out["limits"] == {"rpm": None, "tpm": 500, "max_concurrency": None}
    assert events == [TenantChanged("acme", "keys", key_id=plain["id"], key_change="limits")]
    shown = await call(api, "GET", "/tenants/acme", 200)
    assert {k["id"]: k["limits"]["tpm"] for k in shown["keys"]} == {
        created["id"]: None,
        plain["id"]: 500,
    }
    audit = [(a, d) for a, d in await _actions(api) if a.startswith("key.")]
    assert audit[0][1]["limits"] == {"rpm": 10, "tpm": None, "max_concurrency": 2}
    assert audit[-1] == (
        "key.limits",
        {
            "key_id": plain["id"],
            "before": {"rpm": None, "tpm": None, "max_concurrency": None},
            "after": {"rpm": None, "tpm": 500, "max_concurrency": None},
        },
    )
    # The same limits again: nothing written.
    await call(api, "PUT", path, 200, json={"tpm": 500})
    assert [a for a, _ in await _actions(api)].count("key.limits") == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"rpm": 0}, "rpm"),
        ({"tpm": 2**31}, "tpm"),
        ({"max_output_tokens": 5}, "max_output_tokens"),
        ({"rpm": "5"}, "rpm"),
    ],
)
async def test_key_limits_invalid(api: TestClient, body: dict[str, Any], param: str) -> None:
    await call(api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme"})
    key = await call(api, "POST", "/tenants/acme/keys", 201, json={"kind": "server"})
    err = error(await call(api, "PUT", f"/tenants/acme/keys/{key['id']}/limits", 422, json=body))
    assert err["param"] == param
    err = error(
        await call(api, "POST", "/tenants/acme/keys", 422, json={"kind": "server", "limits": body})
    )
    assert err["param"] == f"limits.{param}"


async def test_key_routes_unknown(api: TestClient) -> None:
    err = error(await call(api, "GET", "/tenants/ghost/keys", 404))
    assert err["code"] == "tenant_not_found"
    await call(api, "POST", "/tenants", 201, json={"id": "acme", "name": "Acme"})
    err = error(await call(api, "PUT", "/tenants/acme/keys/nokey/limits", 404, json={}))
    assert err["code"] == "key_not_found"
    assert (await call(api, "GET", "/tenants/acme/keys", 200)) == {"data": []}
