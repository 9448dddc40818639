"""The ledger writer on both backends: a batch applied twice changes nothing (records unique,
rollups added once), PostgreSQL records land in monthly partitions, retention drops whole old
months there and deletes in batches on SQLite, and ``kvgate usage`` reports what the rollups
hold."""

from __future__ import annotations

import asyncio
import csv
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from gateway.commands.usage import main as usage_cli
from gateway.usage import reports
from gateway.usage.admin import REPORT_CSV
from gateway.usage.partitions import list_partitions
from gateway.usage.record import UsageRecord
from gateway.usage.writer import LedgerWriter
from tenants.db import make_engine


def _rec(i: int, at: datetime, tenant: str = "t1") -> UsageRecord:
    return UsageRecord(
        request_id=f"req-{i}",
        at_us=int(at.timestamp() * 1_000_000),
        tenant_id=tenant,
        key_id=f"key-{i % 3}",
        end_user=f"user-{i % 5}" if i % 2 else None,
        model="m",
        prompt_tokens=10 + i,
        cached_tokens=i % 4,
        completion_tokens=i,
        spend_nanos=100 * i,
    )


async def test_idempotent_batches_partitions_retention_and_cli(
    ledger_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = make_engine(ledger_database)
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    old = now - timedelta(days=100)
    batch = [_rec(i, now - timedelta(minutes=i)) for i in range(40)]
    batch += [_rec(100 + i, old) for i in range(5)]
    try:
        writer = LedgerWriter(engine)
        assert await writer.apply(batch) == len(batch)
        assert await writer.apply(batch[::-1]) == 0  # a replay: nothing new
        async with engine.connect() as conn:
            n = (await conn.execute(text("SELECT count(*) FROM usage_records"))).scalar_one()
        assert n == len(batch)
        start = (old - timedelta(days=1)).replace(minute=0)
        end = now.replace(minute=0) + timedelta(hours=2)
        page = await reports.report(
            engine, start=start, end=end, group_by="key", limit=None, tenant="t1"
        )
        assert sum(g.totals.requests for g in page.groups) == len(batch)
        assert sum(g.totals.completion_tokens for g in page.groups) == sum(
            r.completion_tokens for r in batch
        )
        paged: list[str] = []
        cursor = None
        while True:  # pagination gives every group once
            p = await reports.report(
                engine,
                start=start,
                end=end,
                group_by="end_user",
                tenant="t1",
                limit=2,
                cursor=cursor,
            )
            paged += [g.group for g in p.groups]
            cursor = p.next_cursor
            if cursor is None:
                break
        assert paged == sorted(set(paged)) and len(paged) == 6  # 5 users and "no user"
        if writer.postgres:
            months = await list_partitions(engine)
            assert (old.year, old.month) in months and (now.year, now.month) in months

        assert await LedgerWriter(engine, retention_days=30).trim() >= 1
        async with engine.connect() as conn:
            left = (await conn.execute(text("SELECT count(*) FROM usage_records"))).scalar_one()
        assert left == 40  # the recent ones
        if writer.postgres:
            assert (old.year, old.month) not in await list_partitions(engine)
        # Rollups outlive the records: the old month is still in the reports.
        page = await reports.report(
            engine, start=start, end=end, group_by="day", limit=None, tenant="t1"
        )
        assert sum(g.totals.requests for g in page.groups) == len(batch)
    finally:
        await engine.dispose()

    t0 = time.perf_counter()
    code = await asyncio.to_thread(
        usage_cli,
        ["usage", "report", "--database-url", ledger_database, "--tenant", "t1",
         "--start", start.isoformat(), "--end", end.isoformat(), "--group-by", "model"]
    )  # fmt: skip
    assert code == 0 and time.perf_counter() - t0 < 30
    (line,) = capsys.readouterr().out.strip().splitlines()
    row = json.loads(line)
    assert row["requests"] == len(batch)
    # totals and spend as the admin API reports them
    tokens = sum(r.prompt_tokens + r.completion_tokens for r in batch)
    nanos = sum(r.spend_nanos for r in batch)
    assert row["total_tokens"] == tokens
    assert row["spend_nanos"] == nanos and row["spend_usd"] == pytest.approx(nanos / 1e9)
    code = await asyncio.to_thread(
        usage_cli,
        ["usage", "report", "--database-url", ledger_database, "--tenant", "t1",
         "--start", start.isoformat(), "--end", end.isoformat(), "--group-by", "model", "--csv"]
    )  # fmt: skip
    assert code == 0
    (row,) = list(csv.DictReader(capsys.readouterr().out.splitlines()))
    assert list(row) == list(REPORT_CSV)  # the admin API's CSV columns
    assert int(row["total_tokens"]) == tokens
    assert float(row["spend_usd"]) == pytest.approx(nanos / 1e9)
