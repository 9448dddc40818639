"""Rollup rows of a batch of records: 4 dimensions x 2 periods per record, summed in Python so
one upsert statement touches each rollup row once (PostgreSQL refuses a row twice in one
``ON CONFLICT DO UPDATE``), in key order (concurrent gateways lock rows in the same order: no
deadlocks)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from gateway.usage.record import UsageRecord

RollupKey = tuple[str, str, str, datetime, str]  # tenant, period, dim, bucket, value
COUNTERS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "spend_nanos")
HOUR_US = 3_600_000_000
DAY_US = 24 * HOUR_US


def bucket_start(at_us: int, period: str) -> datetime:
    size = HOUR_US if period == "hour" else DAY_US
    return datetime.fromtimestamp((at_us // size) * size / 1_000_000, UTC)


def dimension_values(rec: UsageRecord) -> tuple[tuple[str, str], ...]:
    return (
        ("tenant", ""),
        ("key", rec.key_id or ""),
        ("end_user", rec.end_user or ""),
        ("model", rec.model),
    )


def rollup_rows(records: Iterable[UsageRecord]) -> list[dict[str, object]]:
    sums: dict[RollupKey, list[int]] = {}
    for rec in records:
        counts = (
            1,
            rec.prompt_tokens,
            rec.cached_tokens,
            rec.completion_tokens,
            rec.spend_nanos,
        )
        for period in ("hour", "day"):
            bucket = bucket_start(rec.at_us, period)
            for dim, value in dimension_values(rec):
                acc = sums.setdefault((rec.tenant_id, period, dim, bucket, value), [0] * 5)
                for i, c in enumerate(counts):
                    acc[i] += c
    rows = []
    for key in sorted(sums):
        tenant, period, dim, bucket, value = key
        row: dict[str, object] = {
            "tenant_id": tenant,
            "period": period,
            "dim": dim,
            "bucket": bucket,
            "value": value,
        }
        row.update(zip(COUNTERS, sums[key], strict=True))
        rows.append(row)
    return rows
