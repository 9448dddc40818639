"""POST /v1/widget/sessions: rate-limited per server key like the chat API (429 + headers), and
no database write per issued token (the secret is created once, race-safe, then read cached)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import event

from gateway.access.auth import Principal
from gateway.ratelimit import RedisLimiter, make_client
from gateway.widget.issuance import issuance_lease
from tenants.runtime import KeyIdentity, TenantRuntime
from tenants.settings import Limits
from tests.conftest import SHARED_REDIS_URL
from tests.gateway.harness import LiveGateway, live_gateway, make_settings
from tests.widget.helpers import new_session, request, widget_chat, widget_tenant

SITE = "https://shop.example"


@contextmanager
def statements(gw: LiveGateway) -> Iterator[list[str]]:
    """Every SQL statement the gateway's engine sends meanwhile."""
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *rest: object) -> None:
        seen.append(statement.strip().upper())

    engine = gw.state.store.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def writes(seen: list[str]) -> list[str]:
    return [s for s in seen if s.startswith(("INSERT", "UPDATE", "DELETE")) or "FOR UPDATE" in s]


async def issue(gw: LiveGateway, key: str, user: str = "u") -> tuple[int, dict[str, str], object]:
    status, headers, body = await request(
        gw,
        "POST",
        "/v1/widget/sessions",
        json={"end_user_id": user, "origin": SITE},
        Authorization=f"Bearer {key}",
    )
    return status, dict(headers), body


async def test_sessions_are_rate_limited_per_server_key(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path, KVGATE_WIDGET_SESSION_RPM="3")
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await widget_tenant(gw, "issue", [SITE])
        other = (await gw.admin("POST", f"/tenants/{t.id}/keys", {"kind": "server"}))["key"]
        for i in range(3):
            status, headers, _ = await issue(gw, t.server_key)
            assert status == 201
            assert headers["x-ratelimit-limit-requests"] == "3"
            assert headers["x-ratelimit-remaining-requests"] == str(2 - i)
            assert headers["x-ratelimit-scope"] == "key"
        status, headers, body = await issue(gw, t.server_key)
        assert status == 429, body
        assert body["error"]["code"] == "rate_limit_exceeded"  # type: ignore[index]
        assert int(headers["Retry-After"]) >= 1 and headers["x-ratelimit-scope"] == "key"
        assert (await issue(gw, other))[0] == 201  # another key of the tenant: its own bucket
        # The limit is the issuance's own: the key's chat traffic and sessions still work.
        chat = await request(
            gw,
            "POST",
            "/v1/chat/completions",
            json={"model": gw.state.model_name, "messages": [{"role": "user", "content": "hi"}]},
            Authorization=f"Bearer {t.server_key}",
        )
        assert chat[0] == 200
        _, session = await new_session(gw, other, SITE)
        assert (await widget_chat(gw, session["token"], SITE))[0] == 200


async def test_issuing_tokens_writes_once_per_tenant_not_per_token(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await widget_tenant(gw, "nowrite", [SITE])
        with statements(gw) as first:
            assert (await issue(gw, t.server_key))[0] == 201
        with statements(gw) as later:
            for i in range(20):
                status, _, body = await issue(gw, t.server_key, user=f"u{i}")
                assert status == 201
        assert writes(later) == []  # no transaction, no row lock per token
        assert len(later) <= 1, later  # the runtime re-read after the secret's event, at most
        assert len(writes(first)) == 2, writes(first)  # the secret (conditional) + its audit row
        _, _, body = await issue(gw, t.server_key)
        assert (await widget_chat(gw, body["token"], SITE))[0] == 200  # type: ignore[index]


async def test_concurrent_first_uses_agree_on_one_secret(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await widget_tenant(gw, "race", [SITE])
        replies = await asyncio.gather(*(issue(gw, t.server_key, f"u{i}") for i in range(10)))
        assert {r[0] for r in replies} == {201}
        for _, _, body in replies:  # every token verifies under the one secret that was kept
            assert (await widget_chat(gw, body["token"], SITE))[0] == 200  # type: ignore[index]
        audit = await gw.admin("GET", f"/audit?tenant={t.id}")
        assert [r["action"] for r in audit["data"]].count("widget.create_secret") == 1


async def test_the_issuance_bucket_never_meets_the_tenants_chat_scopes() -> None:
    """Through the shared (Redis) limiter: the key's issuance RPM lives under its own hash tag;
    exhausting it writes none of the tenant's or the key's chat keys."""
    prefix = f"kvgate-test-{uuid.uuid4().hex[:12]}:"
    client = make_client(SHARED_REDIS_URL, 1.0)
    limiter = RedisLimiter(client, prefix)
    rt = TenantRuntime("acme", "active", "salt", None, None, Limits(5, 5, 5, 5), True)
    principal = Principal(KeyIdentity("acme", "key_1", "server", (), rpm=100), rt)
    try:
        allowed = []
        for _ in range(3):
            lease = issuance_lease(principal, 2)
            allowed.append((await limiter.acquire(lease)).allowed)
            await limiter.release(lease, 0)
        assert allowed == [True, True, False]
        keys = {k.decode() async for k in client.scan_iter(match=f"{prefix}*")}
        assert keys == {f"{prefix}rl:{{acme:sessions}}:key:key_1:rpm"}
    finally:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
        await limiter.close()
