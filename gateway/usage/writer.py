"""``LedgerWriter.apply(records)``: one transaction per batch on the ledger's own connection pool.

    (PostgreSQL) make the months' partitions -> INSERT records ON CONFLICT DO NOTHING RETURNING
    -> upsert the rollups of the records that were inserted -> COMMIT

Idempotent: a record already in the database (a replay, a retry after a commit whose answer was
lost) is not inserted again and adds nothing to the rollups, so records and rollups move
together. Records older than the retention cutoff are dropped before the insert (their partition
may be gone).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, Table, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from gateway.usage.partitions import Partitions, drop_before, month_of
from gateway.usage.record import UsageRecord
from gateway.usage.rollup import COUNTERS, rollup_rows
from tenants.usage_models import UsageRecordRow, UsageRollupRow

RECORDS = cast(Table, UsageRecordRow.__table__)  # a declarative class: its Table
ROLLUPS = cast(Table, UsageRollupRow.__table__)
ROLLUP_PK = ("tenant_id", "period", "dim", "bucket", "value")
SQLITE_DELETE_BATCH = 5000


def _row(rec: UsageRecord) -> dict[str, Any]:
    return {
        "request_id": rec.request_id,
        "at": rec.at,
        "tenant_id": rec.tenant_id,
        "key_id": rec.key_id,
        "end_user": rec.end_user,
        "model": rec.model,
        "prompt_tokens": rec.prompt_tokens,
        "cached_tokens": rec.cached_tokens,
        "completion_tokens": rec.completion_tokens,
        "choices": rec.choices,
        "stream": rec.stream,
        "status": rec.status,
        "outcome": rec.outcome,
        "error": rec.error,
        "finish_reason": rec.finish_reason,
        "ttft_ms": rec.ttft_ms,
        "duration_ms": rec.duration_ms,
        "worker": rec.worker,
        "prompt_version": rec.prompt_version,
        "spend_nanos": rec.spend_nanos,
        "tool_calls": rec.tool_calls,
    }


class LedgerWriter:
    def __init__(self, engine: AsyncEngine, retention_days: int | None = None) -> None:
        self.engine = engine
        self.retention_days = retention_days
        self.postgres = engine.dialect.name == "postgresql"
        self._insert = postgresql.insert if self.postgres else sqlite.insert
        self.partitions = Partitions()

    def cutoff(self, now: datetime | None = None) -> datetime | None:
        if self.retention_days is None:
            return None
        return (now or datetime.now(UTC)) - timedelta(days=self.retention_days)

    async def apply(self, records: Sequence[UsageRecord]) -> int:
        """Write ``records``; returns how many were new. Raises on any database failure (the
        caller keeps them in the spool)."""
        cutoff = self.cutoff()
        if cutoff is not None:
            records = [r for r in records if r.at >= cutoff]
        if not records:
            return 0
        by_id = {(r.request_id, r.at_us): r for r in records}  # one record per id in a batch
        if self.postgres:
            await self.partitions.ensure(self.engine, {month_of(r.at) for r in by_id.values()})
        async with AsyncSession(self.engine) as session, session.begin():
            inserted = await self._insert_records(session, list(by_id.values()))
            await self._upsert_rollups(session, inserted)
        return len(inserted)

    async def _insert_records(
        self, session: AsyncSession, records: list[UsageRecord]
    ) -> list[UsageRecord]:
        """One executemany (SQLAlchemy's insertmanyvalues: multi-row VALUES pages of a statement
        compiled once) whose RETURNING names the rows that were new."""
        stmt = (
            self._insert(RECORDS)
            .on_conflict_do_nothing(index_elements=["request_id", "at"])
            .returning(RECORDS.c.request_id)
        )
        index = {r.request_id: r for r in records}
        result = await session.execute(stmt, [_row(r) for r in records])
        return [index[rid] for (rid,) in result]

    async def _upsert_rollups(self, session: AsyncSession, records: list[UsageRecord]) -> None:
        rows = rollup_rows(records)
        if not rows:
            return
        stmt = self._insert(ROLLUPS)
        stmt = stmt.on_conflict_do_update(
            index_elements=list(ROLLUP_PK),
            set_={c: ROLLUPS.c[c] + stmt.excluded[c] for c in COUNTERS},
        )
        await session.execute(stmt, rows)

    async def trim(self, now: datetime | None = None) -> int:
        """Retention: PostgreSQL drops whole months older than the cutoff; SQLite deletes
        older records in batches (each its own short transaction, so writers are not held)."""
        cutoff = self.cutoff(now)
        if cutoff is None:
            return 0
        if self.postgres:
            return len(await drop_before(self.engine, cutoff, self.partitions))
        total = 0
        while True:
            async with AsyncSession(self.engine) as session, session.begin():
                ids = select(RECORDS.c.request_id).where(RECORDS.c.at < cutoff)
                stmt = delete(RECORDS).where(
                    RECORDS.c.request_id.in_(ids.limit(SQLITE_DELETE_BATCH).scalar_subquery())
                )
                n = cast(CursorResult[Any], await session.execute(stmt)).rowcount or 0
            total += n
            if n < SQLITE_DELETE_BATCH:
                return total
