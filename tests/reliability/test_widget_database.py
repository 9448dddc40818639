"""The widget's database work under a stalled (blackholed) tenant database, behind a live gateway.

Widget settings writes go through the tenant store's units of work: a quick OpenAI-shaped 503
within the database deadline (then at once, while the database is down), and nothing
half-written. Issuing a session token writes nothing once the tenant has a secret, so it keeps
working from last-known-good. Session tokens whose issuing key is known keep chatting;
a token whose issuing key was revoked before the outage stays refused (401), as does its key.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.gateway.harness import ADMIN_TOKEN
from tests.reliability.test_database import (
    DB_TIMEOUT_S,
    MARGIN_S,
    assert_unavailable,
    gateway_behind_proxy,
    readyz_once_back,
)
from tests.widget.helpers import chat_body, new_session, request, widget_tenant

SITE = "https://shop.example"


async def chat(gw: Any, bearer: str, origin: str | None = SITE) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {bearer}"}
    if origin is not None:
        headers["Origin"] = origin
    status, _, body = await request(
        gw, "POST", "/v1/chat/completions", json=chat_body(gw, ("user", "hi")), **headers
    )
    return status, body


async def timed(call: Any) -> tuple[int, Any, float]:
    started = time.monotonic()
    status, _, body = await call
    return status, body, time.monotonic() - started


async def test_widget_writes_refused_quickly_and_tokens_keep_working_in_a_stall(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    # one database trial per 5 s while it is down: every call after the first trial must fail
    # at once, however loaded the machine
    behind = gateway_behind_proxy(gateway_database, demo_model_dir, tmp_path, retry_s=5.0)
    async with behind as (gw, proxy):
        t = await widget_tenant(gw, "wdb", [SITE])
        other = await gw.admin("POST", f"/tenants/{t.id}/keys", {"kind": "server"})
        await gw.admin("PUT", f"/tenants/{t.id}/widget", {"title": "Before"})
        _, kept = await new_session(gw, t.server_key, SITE, user="u1")
        _, doomed = await new_session(gw, other["key"], SITE, user="u2")
        for token in (kept["token"], doomed["token"]):
            assert (await chat(gw, token))[0] == 200  # the issuers are now cached
        await gw.admin("DELETE", f"/tenants/{t.id}/keys/{other['id']}")
        audit_before = await gw.admin("GET", f"/audit?tenant={t.id}")
        settings_before = await gw.admin("GET", f"/tenants/{t.id}/widget")

        await proxy.blackhole()
        await asyncio.sleep(0.3)  # past the key cache TTL: every entry is stale
        admin_put = dict(
            json={"title": "During", "require_session": True},
            Authorization=f"Bearer {ADMIN_TOKEN}",
        )
        # The first waits for the deadline; while the database is down the rest fail at once.
        for bound in (DB_TIMEOUT_S + MARGIN_S, MARGIN_S):
            status, body, took = await timed(
                request(gw, "PUT", f"/admin/v1/tenants/{t.id}/widget", **admin_put)
            )
            assert_unavailable(status, body)
            assert took < bound
        status, body, took = await timed(
            request(
                gw,
                "POST",
                "/v1/widget/sessions",
                json={"end_user_id": "u3", "origin": SITE},
                Authorization=f"Bearer {t.server_key}",
            )
        )
        # Issuing needs no write once the tenant has a secret: served from last-known-good.
        assert status == 201, body
        assert took < MARGIN_S
        assert (await chat(gw, body["token"]))[0] == 200
        assert (await chat(gw, kept["token"]))[0] == 200  # issuer and tenant: last-known-good
        assert (await chat(gw, t.server_key, origin=None))[0] == 200
        status, body = await chat(gw, doomed["token"])
        assert status == 401 and body["error"]["code"] == "invalid_session_token", body
        status, body = await chat(gw, other["key"], origin=None)
        assert status == 401 and body["error"]["code"] == "invalid_api_key", body

        await proxy.restore()
        status, ready = await readyz_once_back(gw)  # its probe finds the database back
        assert status == 200 and ready["database"]["status"] == "ok", ready
        assert await gw.admin("GET", f"/tenants/{t.id}/widget") == settings_before
        assert await gw.admin("GET", f"/audit?tenant={t.id}") == audit_before
        gw.state.keys.check_integrity()
        await gw.state.store.check_integrity()
