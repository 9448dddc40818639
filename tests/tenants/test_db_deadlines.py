"""Database deadlines: ``within`` bounds the wait even when the cancelled work's clean-up is slow;
the engine carries the request-path timeouts (SQLite busy timeout, asyncpg command timeout)."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tenants.db import is_unavailable, make_engine, within
from tenants.store import TenantStore


async def test_within_returns_the_result_in_time() -> None:
    async def work() -> int:
        await asyncio.sleep(0.01)
        return 7

    assert await within(1.0, work()) == 7
    assert await within(None, work()) == 7


async def test_within_does_not_wait_for_a_slow_clean_up() -> None:
    cleaned: list[bool] = []

    async def stalled() -> None:
        try:
            await asyncio.sleep(60)  # a statement the server never answers
        finally:
            await asyncio.sleep(0.5)  # a rollback on the dead connection
            cleaned.append(True)

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await within(0.1, stalled())
    assert time.monotonic() - started < 0.3
    assert cleaned == []  # still cleaning up, in the background
    await asyncio.sleep(0.6)
    assert cleaned == [True]


async def test_a_late_failure_of_the_cut_work_is_not_reported_as_lost() -> None:
    """The clean-up of work cut by the deadline may fail in turn (a rollback on a dead
    connection times out): expected, not an asyncio "exception was never retrieved" error."""
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))

    async def stalled() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.05)
            raise TimeoutError("the rollback timed out too")

    try:
        with pytest.raises(TimeoutError):
            await within(0.05, stalled())
        await asyncio.sleep(0.2)  # the clean-up has failed by now
        gc.collect()  # a task's lost exception is reported when the task is collected
        assert reported == []
    finally:
        loop.set_exception_handler(None)


async def test_within_cancels_the_work_when_the_caller_is_cancelled() -> None:
    state: list[str] = []

    async def work() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            state.append("cancelled")
            raise

    caller = asyncio.create_task(within(10.0, work()))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.sleep(0)
    assert state == ["cancelled"]


async def test_sqlite_busy_timeout_is_the_deadline(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", timeout_s=0.75)
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 750
    finally:
        await engine.dispose()


async def test_postgresql_statements_end_at_the_deadline(postgresql_url: str) -> None:
    # The deadline also bounds connecting: 1 s leaves room for a busy machine.
    engine = make_engine(postgresql_url, timeout_s=1.0)
    try:
        async with engine.connect() as conn:
            timeout = (await conn.execute(text("SHOW statement_timeout"))).scalar()
            assert timeout == "1s"
            started = time.monotonic()
            # Server (statement_timeout) and client (command_timeout) share the deadline:
            # whichever fires first ends the statement.
            with pytest.raises((DBAPIError, TimeoutError)) as err:
                await conn.execute(text("SELECT pg_sleep(10)"))
            assert time.monotonic() - started < 4.0
            assert is_unavailable(err.value)  # a stalled statement counts as an outage
    finally:
        await engine.dispose()


async def test_store_units_of_work_for_stores_built_on_it(store: TenantStore) -> None:
    assert await store.read(lambda s: s.scalar(text("SELECT 1"))) == 1
    assert await store.write(lambda s: s.scalar(text("SELECT 2"))) == 2
    assert store.health.up
