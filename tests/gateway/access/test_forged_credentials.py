"""Through the gateway: forged session tokens and unknown keys cost a bounded number of database
reads (statements counted on the engine), and the valid keys' cache entries are not flushed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sqlalchemy import event

from gateway.access import session_tokens as tokens
from tests.gateway.harness import live_gateway, make_settings
from tests.widget.helpers import widget_chat, widget_tenant

SITE = "https://shop.example"
BURST = 50


def forged(tenant_id: str) -> str:
    claims = tokens.SessionClaims(tenant_id, "key_x", SITE, "mallory", int(time.time()) + 600)
    return tokens.sign(claims, "f" * 64)


async def test_forged_tokens_and_unknown_keys_cost_bounded_reads(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path, KVGATE_KEY_CACHE_TTL_S="300")
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await widget_tenant(gw, "forge", [SITE])  # no session secret yet
        assert (await widget_chat(gw, t.widget_key, SITE))[0] == 200
        lookups = gw.state.keys.lookups
        reads: list[str] = []

        def count(conn: object, cursor: object, statement: str, *rest: object) -> None:
            if statement.lstrip().upper().startswith("SELECT") and "FROM" in statement:
                reads.append(statement)

        engine = gw.state.store.engine.sync_engine
        event.listen(engine, "before_cursor_execute", count)
        try:
            started = time.monotonic()
            for bearer in (forged(t.id), forged("made-up-tenant"), "kvg_0123456789ab_" + "x" * 43):
                replies = await asyncio.gather(
                    *(widget_chat(gw, bearer, SITE) for _ in range(BURST))
                )
                assert {r[0] for r in replies} == {401}
            elapsed = time.monotonic() - started
            # The valid widget key still answers from the cache: nothing was flushed.
            assert (await widget_chat(gw, t.widget_key, SITE))[0] == 200
        finally:
            event.remove(engine, "before_cursor_execute", count)
        # Three kinds of forgery, each read at most once per miss TTL (1 s) of the burst.
        assert len(reads) <= 3 * (int(elapsed) + 1), (len(reads), elapsed)
        assert gw.state.keys.lookups - lookups == len(reads)
        gw.state.keys.check_integrity()
