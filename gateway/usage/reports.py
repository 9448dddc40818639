"""Usage reports from the rollups (never the raw records), and raw-record pages.

A report covers [start, end) in whole UTC hours. Grouped by ``hour``, it reads hour rollups;
otherwise the whole UTC days inside the range come from day rollups and the partial days at
either edge from hour rollups, so a month is about 30 rows per group whatever the traffic.

Pagination: groups (and records) come in ascending order of their group value (record:
(at, request_id)); a page holds up to ``limit`` and ``next_cursor`` names the last one. Each
rollup range is queried for values after the cursor, ``limit + 1`` of them: a value among the
first ``limit + 1`` merged is among the first ``limit + 1`` of every range that has it, so the
merged sums are complete.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from gateway.usage.rollup import COUNTERS
from tenants.usage_models import UsageRecordRow, UsageRollupRow

TENANT_GROUPS = ("hour", "day", "key", "end_user", "model")
GLOBAL_GROUPS = ("tenant", "hour", "day", "key", "end_user", "model")
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
R = UsageRollupRow


@dataclass(frozen=True)
class Totals:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    spend_nanos: int = 0

    def __add__(self, other: Totals) -> Totals:
        return Totals(*(a + b for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def astuple(self) -> tuple[int, ...]:
        return (
            self.requests,
            self.prompt_tokens,
            self.cached_tokens,
            self.completion_tokens,
            self.spend_nanos,
        )


@dataclass(frozen=True)
class Group:
    group: str
    totals: Totals


@dataclass(frozen=True)
class Page:
    groups: list[Group]
    next_cursor: str | None


def floor_day(t: datetime) -> datetime:
    return t.replace(hour=0, minute=0, second=0, microsecond=0)


def ceil_day(t: datetime) -> datetime:
    f = floor_day(t)
    return f if f == t else f + DAY


def ranges(start: datetime, end: datetime, group_by: str) -> list[tuple[str, datetime, datetime]]:
    """(period, lo, hi) rollup ranges that cover [start, end) exactly."""
    if group_by == "hour":
        return [("hour", start, end)]
    d0, d1 = ceil_day(start), floor_day(end)
    if d0 >= d1:
        return [("hour", start, end)]
    out = [("day", d0, d1)]
    if start < d0:
        out.insert(0, ("hour", start, d0))
    if d1 < end:
        out.append(("hour", d1, end))
    return out


def encode_cursor(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    pad = "=" * (-len(cursor) % 4)
    return base64.urlsafe_b64decode(cursor + pad).decode()


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _query(
    group_by: str, period: str, lo: datetime, hi: datetime, tenant: str | None
) -> Select[tuple[object, ...]]:
    sums = [func.sum(getattr(R, c)) for c in COUNTERS]
    dim = "tenant" if group_by in ("hour", "day", "tenant") else group_by
    key = {"tenant": R.tenant_id, "hour": R.bucket, "day": R.bucket}.get(group_by, R.value)
    q = select(key, *sums).where(R.period == period, R.dim == dim, R.bucket >= lo, R.bucket < hi)
    if tenant is not None:
        q = q.where(R.tenant_id == tenant)
    return q.group_by(key).order_by(key)


def _group_value(group_by: str, raw: object) -> str:
    if isinstance(raw, datetime):
        t = raw.replace(tzinfo=UTC) if raw.tzinfo is None else raw
        return _iso(floor_day(t) if group_by == "day" else t)
    return str(raw)


async def report(
    engine: AsyncEngine,
    *,
    start: datetime,
    end: datetime,
    group_by: str,
    tenant: str | None = None,
    limit: int | None = 100,
    cursor: str | None = None,
) -> Page:
    after = decode_cursor(cursor) if cursor else None
    merged: dict[str, Totals] = {}
    async with AsyncSession(engine) as session:
        for period, lo, hi in ranges(start, end, group_by):
            q = _query(group_by, period, lo, hi, tenant)
            if after is not None and group_by not in ("hour", "day"):
                key_col = R.tenant_id if group_by == "tenant" else R.value
                q = q.where(key_col > after)
            elif after is not None:
                q = q.where(R.bucket >= datetime.fromisoformat(after))
            if limit is not None and group_by not in ("day",):
                q = q.limit(limit + 1)
            for row in await session.execute(q):
                raw, vals = row[0], tuple[int | None, ...](row[1:])  # the counter sums
                name = _group_value(group_by, raw)
                if after is not None and name <= after:
                    continue
                merged[name] = merged.get(name, Totals()) + Totals(*(int(v or 0) for v in vals))
    names = sorted(merged)
    more = limit is not None and len(names) > limit
    names = names[:limit] if limit is not None else names
    groups = [Group(n, merged[n]) for n in names]
    return Page(groups, encode_cursor(names[-1]) if more and names else None)


# -- raw records -------------------------------------------------------------------------------
RECORD_COLUMNS: Sequence[str] = (
    "request_id",
    "at",
    "tenant_id",
    "key_id",
    "end_user",
    "model",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "choices",
    "stream",
    "status",
    "outcome",
    "error",
    "finish_reason",
    "ttft_ms",
    "duration_ms",
    "worker",
    "prompt_version",
    "spend_nanos",
    "tool_calls",
)


@dataclass(frozen=True)
class RecordPage:
    rows: list[dict[str, object]]
    next_cursor: str | None


async def records(
    engine: AsyncEngine,
    tenant: str,
    *,
    start: datetime,
    end: datetime,
    limit: int,
    cursor: str | None = None,
) -> RecordPage:
    rec = UsageRecordRow
    q = select(rec).where(rec.tenant_id == tenant, rec.at >= start, rec.at < end)
    if cursor:
        at_iso, _, rid = decode_cursor(cursor).partition(" ")
        at = datetime.fromisoformat(at_iso)
        q = q.where(or_(rec.at > at, and_(rec.at == at, rec.request_id > rid)))
    q = q.order_by(rec.at, rec.request_id).limit(limit + 1)
    async with AsyncSession(engine) as session:
        found = list((await session.execute(q)).scalars())
    more = len(found) > limit
    found = found[:limit]
    rows = [{c: getattr(r, c) for c in RECORD_COLUMNS} for r in found]
    for row in rows:
        row["at"] = _iso(row["at"])
    nxt = None
    if more and found:
        last = found[-1]
        nxt = encode_cursor(f"{last.at.astimezone(UTC).isoformat()} {last.request_id}")
    return RecordPage(rows, nxt)
