"""Widget session tokens answer to the server key that issued them: revoking it ends them, and
their traffic counts against its own limits. Rate-limit rejections are counted per refusing
scope (``kvgate_ratelimit_rejections_total{scope=...}``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.harness import LiveGateway
from tests.widget.helpers import new_session, widget_chat, widget_tenant

pytestmark = pytest.mark.asyncio(loop_scope="module")

SITE = "https://shop.example"


async def chat(gw: LiveGateway, token: str) -> tuple[int, str | None, Any]:
    """(status, x-ratelimit-scope, body) of one chat through a session token."""
    status, headers, body = await widget_chat(gw, token, SITE)
    return status, headers.get("x-ratelimit-scope"), body


async def token(gw: LiveGateway, server_key: str, user: str) -> str:
    status, session = await new_session(gw, server_key, SITE, user=user)
    assert status == 201, session
    return str(session["token"])


async def rejections(gw: LiveGateway, tenant_id: str, scope: str) -> float:
    text = await (await gw.http.get(gw.metrics_url)).text()
    labels = f'reason="requests",scope="{scope}",tenant="{tenant_id}"'
    for line in text.splitlines():
        if line.startswith(f"kvgate_ratelimit_rejections_total{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_revoking_the_issuing_key_ends_its_tokens(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "revoke", [SITE])
    other = await gw.admin("POST", f"/tenants/{t.id}/keys", {"kind": "server"})
    doomed = await token(gw, t.server_key, "alice")
    kept = await token(gw, other["key"], "bob")
    assert (await chat(gw, doomed))[0] == 200
    assert (await chat(gw, kept))[0] == 200
    keys = (await gw.admin("GET", f"/tenants/{t.id}/keys"))["data"]
    issuer = next(k for k in keys if k["kind"] == "server" and k["id"] != other["id"])
    await gw.admin("DELETE", f"/tenants/{t.id}/keys/{issuer['id']}")
    status, _, body = await chat(gw, doomed)
    assert status == 401 and body["error"]["code"] == "invalid_session_token", body
    assert (await chat(gw, kept))[0] == 200  # another key's tokens are unaffected
    gw.state.keys.check_integrity()


async def test_session_traffic_counts_against_the_issuing_keys_limits(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "keylim", [SITE])
    limited = await gw.admin(
        "POST", f"/tenants/{t.id}/keys", {"kind": "server", "limits": {"rpm": 1}}
    )
    assert (await chat(gw, await token(gw, limited["key"], "carol")))[0] == 200
    # Another end user (its own visitor scope), the same issuing key: that key's minute is spent.
    status, scope, _ = await chat(gw, await token(gw, limited["key"], "dave"))
    assert (status, scope) == (429, "key")
    assert (await chat(gw, await token(gw, t.server_key, "erin")))[0] == 200  # unlimited key
    assert await rejections(gw, t.id, "key") == 1.0
    assert await rejections(gw, t.id, "visitor") == 0.0


async def test_visitor_rejections_are_counted_with_their_scope(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "vislim", [SITE])
    await gw.admin("PUT", f"/tenants/{t.id}/widget", {"visitor_limits": {"rpm": 1}})
    assert (await chat(gw, await token(gw, t.server_key, "frank")))[0] == 200
    status, scope, _ = await chat(gw, await token(gw, t.server_key, "frank"))
    assert (status, scope) == (429, "visitor")
    assert await rejections(gw, t.id, "visitor") == 1.0
    assert await rejections(gw, t.id, "key") == 0.0
