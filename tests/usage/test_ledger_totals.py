"""The ledger's records and rollups equal the ``usage`` objects the official client received.

Streams (with ``include_usage``), non-streams, ``n`` > 1 both ways, a stream the client cancels
(recorded as cancelled with what was generated), a refused body after a good key (a record with
no tokens), a bad key (no record). Run on PostgreSQL and SQLite.
"""

from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest
from sqlalchemy import text

from gateway.usage.ledger import LEDGER
from tests.gateway.harness import live_gateway, make_settings
from tests.usage.helpers import Seen, hour_range, ledger_totals, wait_records

PRICES = '{"%s": {"input": 1.5, "cached_input": 0.5, "output": 6}}'


async def _traffic(client: openai.AsyncOpenAI, model: str, seen: Seen) -> int:
    """Sends every kind of request; returns how many requests were sent."""
    msgs = [{"role": "user", "content": "hello there, how are you?"}]
    for i in range(3):
        resp = await client.chat.completions.create(
            model=model, messages=msgs, max_tokens=4 + i, temperature=0
        )
        seen.add(resp.usage)
        stream = await client.chat.completions.create(
            model=model,
            messages=msgs,
            max_tokens=3 + i,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [c.usage async for c in stream if c.usage is not None]
        seen.add(usage[-1])
    resp = await client.chat.completions.create(model=model, messages=msgs, max_tokens=5, n=3)
    seen.add(resp.usage)
    stream = await client.chat.completions.create(
        model=model,
        messages=msgs,
        max_tokens=4,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage async for c in stream if c.usage is not None]
    seen.add(usage[-1])
    return 8


async def test_ledger_equals_client_usage(
    ledger_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(
        ledger_database,
        tmp_path,
        KVGATE_MODEL_NAME="demo",
        KVGATE_USAGE_PRICES=PRICES % "demo",
    )
    async with live_gateway(settings, demo_model_dir) as gw:
        tenant = await gw.create_tenant("acme", system_prompt="You are helpful. " * 8)
        await gw.wait_pinned(tenant.id)
        client = gw.openai(tenant.key)
        seen = Seen()
        sent = await _traffic(client, "demo", seen)
        # A stream the client leaves after two chunks: recorded as cancelled.
        stream = await client.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "tell me a long story"}],
            max_tokens=400,
            stream=True,
        )
        got = 0
        async for _chunk in stream:
            got += 1
            if got == 3:
                break
        await stream.close()
        # A good key with a bad body: a refusal after authentication.
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="demo", messages=[], max_tokens=2)
        # A bad key: counted in metrics only.
        with pytest.raises(openai.AuthenticationError):
            await gw.openai("sk-not-a-key").chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "x"}]
            )
        totals = await wait_records(ledger_database, tenant.id, sent + 2)
        assert totals[0] == totals[4] == sent + 2, totals  # one record per request, unique ids
        engine = gw.app[LEDGER].engine
        answered = await ledger_totals(engine, tenant.id, "AND outcome = 'answered'")
        assert answered[0] == sent
        assert answered[1:4] == seen.tokens(), (answered, seen)
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT outcome, status, completion_tokens, choices, stream, key_id, "
                        "spend_nanos, prompt_tokens, cached_tokens, prompt_version, worker "
                        "FROM usage_records WHERE tenant_id = :t"
                    ),
                    {"t": tenant.id},
                )
            ).all()
        cancelled = [r for r in rows if r.outcome == "cancelled"]
        assert len(cancelled) == 1 and cancelled[0].status == 499
        assert cancelled[0].completion_tokens >= 2  # what was generated before the client left
        refused = [r for r in rows if r.outcome == "refused"]
        assert len(refused) == 1 and refused[0].status == 400
        assert refused[0].prompt_tokens == refused[0].completion_tokens == 0
        assert sorted(r.choices for r in rows if r.outcome == "answered") == [1] * 6 + [2, 3]
        assert len({r.key_id for r in rows}) == 1 and rows[0].key_id  # the one key's id
        assert all(r.prompt_version == 1 for r in rows if r.outcome == "answered")
        assert all(r.worker is None for r in rows)  # the engine in this process: no worker
        for r in rows:  # spend from the configured price, cached input priced as cached
            want = (r.prompt_tokens - r.cached_tokens) * 1_500 + r.cached_tokens * 500
            want += r.completion_tokens * 6_000
            assert r.spend_nanos == want, r

        # The rollups agree with the records, whatever the grouping.
        everything = await ledger_totals(engine, tenant.id)
        spend = sum(r.spend_nanos for r in rows)
        async with gw.http.get(gw.metrics_url) as r:  # the spend metric counts the same
            metric = re.search(
                rf'kvgate_usage_spend_usd_total{{model="demo",tenant="{tenant.id}"}} (\S+)',
                await r.text(),
            )
        assert metric is not None and spend > 0
        assert abs(float(metric.group(1)) - spend / 1e9) < 1e-9
        for group_by in ("hour", "day", "key", "model", "end_user"):
            report = await gw.admin(
                "GET",
                f"/tenants/{tenant.id}/usage?group_by={group_by}&"
                + "&".join(f"{k}={v.replace('+', '%2B')}" for k, v in hour_range().items()),
            )
            data = report["data"]
            assert sum(g["requests"] for g in data) == everything[0], (group_by, data)
            assert sum(g["prompt_tokens"] for g in data) == everything[1]
            assert sum(g["cached_tokens"] for g in data) == everything[2]
            assert sum(g["completion_tokens"] for g in data) == everything[3]
            assert sum(g["spend_nanos"] for g in data) == spend
