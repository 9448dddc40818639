"""Helpers of the ledger tests: usage the clients saw, what the ledger holds, waiting for it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tenants.db import make_engine


@dataclass
class Seen:
    """Sums of the ``usage`` objects a client received."""

    requests: int = 0
    prompt: int = 0
    cached: int = 0
    completion: int = 0

    def add(self, usage: Any) -> None:
        self.requests += 1
        self.prompt += usage.prompt_tokens
        self.completion += usage.completion_tokens
        details = usage.prompt_tokens_details
        self.cached += details.cached_tokens if details is not None else 0

    def tokens(self) -> tuple[int, int, int]:
        return self.prompt, self.cached, self.completion


def hour_range() -> dict[str, str]:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start, end = now - timedelta(hours=2), now + timedelta(hours=2)
    return {"start": start.isoformat(), "end": end.isoformat()}


async def ledger_totals(engine: AsyncEngine, tenant: str, where: str = "") -> tuple[int, ...]:
    sql = (
        "SELECT count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(cached_tokens), 0), "
        "coalesce(sum(completion_tokens), 0), count(DISTINCT request_id) FROM usage_records "
        f"WHERE tenant_id = :t {where}"
    )
    async with engine.connect() as conn:
        row = (await conn.execute(text(sql), {"t": tenant})).one()
    return tuple(int(v) for v in row)


async def wait_records(url: str, tenant: str, count: int, timeout: float = 30.0) -> tuple[int, ...]:
    """Poll the database until ``tenant`` has ``count`` records (a fresh engine each time, so
    a test may call it across gateway restarts)."""
    engine = make_engine(url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            totals = await ledger_totals(engine, tenant)
            if totals[0] >= count or time.monotonic() > deadline:
                return totals
            await asyncio.sleep(0.1)
    finally:
        await engine.dispose()
