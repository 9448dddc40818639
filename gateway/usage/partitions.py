"""Monthly partitions of ``usage_records`` on PostgreSQL: made on demand, dropped by retention.

A partition covers one calendar month in UTC: ``usage_records_p202701`` holds
[2027-01-01, 2027-02-01). Before a batch is written, each month it touches is made unless this
process already knows it exists (one ``to_regclass`` per new month and process); concurrent
gateways serialize on an advisory lock, so ``CREATE TABLE IF NOT EXISTS`` never races. The DDL
runs in a short transaction of its own, not inside the batch (it locks the parent table).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

PARENT = "usage_records"
_NAME = re.compile(r"^usage_records_p(\d{4})(\d{2})$")
PARTITION_LOCK = 0x6B76_7573_6167_6570  # "kvusagep": pg_advisory_xact_lock key


def month_of(at: datetime) -> tuple[int, int]:
    return at.year, at.month


def month_start(year: int, month: int) -> datetime:
    return datetime(year, month, 1, tzinfo=UTC)


def next_month(year: int, month: int) -> tuple[int, int]:
    return (year + 1, 1) if month == 12 else (year, month + 1)


def partition_name(year: int, month: int) -> str:
    return f"{PARENT}_p{year:04d}{month:02d}"


class Partitions:
    def __init__(self) -> None:
        self._known: set[tuple[int, int]] = set()

    async def ensure(self, engine: AsyncEngine, months: Iterable[tuple[int, int]]) -> None:
        missing = sorted(set(months) - self._known)
        if not missing:
            return
        async with engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PARTITION_LOCK})
            for year, month in missing:
                lo = month_start(year, month)
                hi = month_start(*next_month(year, month))
                # Names and bounds come from integers and datetimes made here, never from input.
                await conn.execute(
                    text(
                        f"CREATE TABLE IF NOT EXISTS {partition_name(year, month)} "
                        f"PARTITION OF {PARENT} FOR VALUES FROM ('{lo.isoformat()}') "
                        f"TO ('{hi.isoformat()}')"
                    )
                )
        self._known.update(missing)

    def forget(self, months: Iterable[tuple[int, int]]) -> None:
        self._known.difference_update(months)


async def list_partitions(engine: AsyncEngine) -> list[tuple[int, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'usage_records'::regclass"
            )
        )
        out = []
        for (name,) in rows:
            m = _NAME.fullmatch(name)
            if m:
                out.append((int(m.group(1)), int(m.group(2))))
        return sorted(out)


async def drop_before(engine: AsyncEngine, cutoff: datetime, parts: Partitions) -> list[str]:
    """Drop every partition that ends at or before ``cutoff`` (whole months only: a month
    partly inside the retention window is kept until it is wholly outside)."""
    dropped: list[str] = []
    gone: list[tuple[int, int]] = []
    for year, month in await list_partitions(engine):
        if month_start(*next_month(year, month)) <= cutoff:
            async with engine.begin() as conn:
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PARTITION_LOCK})
                await conn.execute(text(f"DROP TABLE IF EXISTS {partition_name(year, month)}"))
            dropped.append(partition_name(year, month))
            gone.append((year, month))
    parts.forget(gone)
    return dropped
