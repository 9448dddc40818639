"""Every route of the real gateway's admin sub-app, for every kind of principal.

Generated from the app's own route table (a route added later is checked without editing this
file; one without an access rule fails start-up, tests/gateway/admin/test_admin_session.py). For
each route and principal the answer must be exactly the policy's: a tenant admin gets 404 on another
tenant's routes (the answer of a missing tenant) and 403 on platform routes, a viewer 403 on
every write; everything else passes the access check (any answer but 401, 403 and that 404,
and never a 5xx). Writes carry bodies the handlers refuse, so the checks change little.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.admin.access import ACCESS, Need, need_of
from tests.gateway.harness import LiveGateway, live_gateway, make_settings

pytestmark = pytest.mark.asyncio(loop_scope="module")

A, B = "tenant-a", "tenant-b"
PARAMS = {
    "key_id": "key_missing",
    "version": "999",
    "admin_id": "adm_missing",
    "model": "no-such-model",
    "path": "index.html",
    "conversation_id": "conv_missing",
    "end_user": "nobody",
}


@dataclass(frozen=True)
class Caller:
    label: str
    token: str
    tenant: str | None  # None: platform
    editor: bool


def expected(caller: Caller, method: str, need: Need, tenant: str | None) -> tuple[int, str] | None:
    """The refusal the policy prescribes (status, code), or None: allowed. Written out from
    docs/api.md, independently of gateway/admin/access.py's ``authorize``: only the scope comes
    from the table; any method but GET is a write."""
    if need.scope in ("public", "self"):
        return None
    if caller.tenant is not None and need.scope == "platform":
        return 403, "platform_admin_required"
    if caller.tenant is not None and tenant != caller.tenant:
        return 404, "tenant_not_found"
    if method != "GET" and not caller.editor:
        return 403, "read_only"
    return None


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    template_database: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveGateway]:
    from tests.gateway.harness import create_database, drop_database, pg_url

    name = await create_database(template_database)
    settings = make_settings(pg_url(name), tmp_path_factory.mktemp("access"))
    try:
        async with live_gateway(settings, demo_model_dir) as live:
            for tid in (A, B):
                await live.admin("POST", "/tenants", {"id": tid, "name": tid})
            yield live
    finally:
        await drop_database(name)


async def _callers(gw: LiveGateway) -> list[Caller]:
    from tests.gateway.harness import ADMIN_TOKEN

    callers = []
    for scope, access in (
        (A, "viewer"),
        (A, "editor"),
        ("platform", "viewer"),
        ("platform", "editor"),
    ):
        made = await gw.admin("POST", "/admins", {"scope": scope, "access": access})
        tenant = None if scope == "platform" else scope
        callers.append(Caller(f"{scope}/{access}", made["token"], tenant, access == "editor"))
    callers.append(Caller("bootstrap", ADMIN_TOKEN, None, True))
    return callers


def _routes(gw: LiveGateway) -> list[tuple[str, str]]:
    admin = next(r for r in gw.app.router.resources() if r.canonical == "/admin")
    routes = []
    for route in admin.get_info()["app"].router.routes():  # the sub-app of the prefix
        if route.method != "HEAD" and route.resource is not None:
            routes.append((route.method, route.resource.canonical))
    return routes


def _fill(path: str, tenant: str) -> str:
    return re.sub(r"\{(\w+)(:[^}]*)?\}", lambda m: tenant if m[1] == "id" else PARAMS[m[1]], path)


async def _ask(gw: LiveGateway, caller: Caller, method: str, url: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {caller.token}"}
    body = None if method in ("GET", "DELETE") else {"not_a_field": True}
    async with gw.http.request(method, gw.base_url + url, json=body, headers=headers) as resp:
        is_json = resp.content_type == "application/json"
        return resp.status, (await resp.json()) if is_json else None


async def test_every_route_answers_every_principal_by_the_policy(gw: LiveGateway) -> None:
    routes = _routes(gw)
    assert len(routes) >= len(ACCESS) - 2, routes  # the real app: usage, budget, cluster too
    callers = await _callers(gw)
    failures: list[str] = []
    for caller in callers:  # the platform editors last: their writes may change tenants
        for method, path in routes:
            need = need_of(method, path)
            assert need is not None, f"{method} {path} has no access rule"
            for tenant in (A, B) if "{id}" in path else (A,):
                status, body = await _ask(gw, caller, method, _fill(path, tenant))
                got = (status, (body or {}).get("error", {}).get("code"))
                want = expected(caller, method, need, tenant if "{id}" in path else None)
                denied = status in (401, 403) or got == (404, "tenant_not_found")
                if want is not None and got != want:
                    failures.append(f"{caller.label} {method} {path} [{tenant}]: {got} != {want}")
                elif want is None and (denied or status >= 500):
                    failures.append(f"{caller.label} {method} {path} [{tenant}]: {got} refused")
    assert not failures, "\n".join(failures)


async def test_the_policy_itself(gw: LiveGateway) -> None:
    """A few rules spelled out, so a wrong entry in the table cannot pass unnoticed."""
    t = "/v1/tenants/{id}"
    tenant_writes = [
        ("PUT", f"{t}/system-prompt"),
        ("POST", f"{t}/keys"),
        ("PUT", f"{t}/widget"),
        ("PUT", f"{t}/keys/{{key_id}}/limits"),
    ]
    platform_only = [
        ("POST", "/v1/tenants"),
        ("GET", "/v1/tenants"),
        ("PATCH", t),
        ("DELETE", t),
        ("PUT", f"{t}/limits"),
        ("PUT", f"{t}/budget"),
        ("GET", "/v1/cluster"),
        ("PUT", "/v1/prices/{model}"),
        ("POST", "/v1/admins"),
        ("GET", "/v1/audit"),
    ]
    tenant_reads = [
        ("GET", t),
        ("GET", f"{t}/usage"),
        ("GET", f"{t}/audit"),
        ("GET", f"{t}/system-prompts"),
    ]
    assert all(ACCESS[r] == Need("tenant", True) for r in tenant_writes)
    assert all(ACCESS[r].scope == "platform" for r in platform_only)
    assert all(ACCESS[r] == Need("tenant", False) for r in tenant_reads)
    writes = [r for r, n in ACCESS.items() if r[0] != "GET" and not n.write]
    assert sorted(writes) == [("DELETE", "/v1/session"), ("POST", "/v1/session")]
