"""A gateway adopts the spools that gone processes left under its var directory: a restart on
another port after a SIGKILL replays every record exactly once (a real ``kvgate serve``), two
spools opening at once never both take a segment, and a live gateway's spool is left alone."""

from __future__ import annotations

import asyncio
import signal
import threading
from datetime import UTC, datetime
from pathlib import Path

import openai
import pytest
from sqlalchemy import text

from gateway.usage.record import UsageRecord
from gateway.usage.spool import Spool, database_tag
from tenants.db import make_engine
from tests.e2e.servers import ServeProcess
from tests.gateway.harness import ADMIN_TOKEN
from tests.usage.helpers import ledger_totals, wait_records
from tests.usage.test_ledger_faults import _admin_key

REQUESTS = 20


async def test_a_restart_on_another_port_replays_the_killed_gateways_spool(
    tmp_path: Path,
) -> None:
    env = {
        "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "KVGATE_MODEL_NAME": "demo",
        # Nothing reaches the database on its own: every record of the first process is in its
        # spool only when it is killed.
        "KVGATE_USAGE_FLUSH_S": "3600",
        "KVGATE_USAGE_BATCH": "100000",
    }
    first = ServeProcess(tmp_path, env)  # the default var dir: ./var under tmp_path
    old = tmp_path / "var" / "usage-spool" / f"port-{first.port}"
    first.start()
    try:
        await first.wait_ready()
        key = await _admin_key(first.url)
        client = openai.AsyncOpenAI(base_url=f"{first.url}/v1", api_key=key, max_retries=0)
        ids = set()
        for i in range(REQUESTS):
            resp = await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=2
            )
            ids.add(resp.id)
        await client.close()
        # A record is written when its handler ends, a moment after the answer's last byte.
        async with asyncio.timeout(30):
            while _spooled(old) < REQUESTS:
                await asyncio.sleep(0.05)
        assert first.proc is not None
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.proc.kill()
    assert _spooled(old) == REQUESTS  # all in the old port's spool, none in the database
    url = f"sqlite+aiosqlite:///{tmp_path / 'var' / 'kvgate.db'}"
    second = ServeProcess(tmp_path, {**env, "KVGATE_USAGE_FLUSH_S": "0.05"})
    assert second.port != first.port
    second.start()
    try:
        await second.wait_ready()
        totals = await wait_records(url, "kill", REQUESTS, timeout=30)
        await asyncio.sleep(0.5)  # a second replay would land by now
        engine = make_engine(url)
        try:
            again = await ledger_totals(engine, "kill")
            async with engine.connect() as conn:
                rollup = await conn.scalar(
                    text(
                        "SELECT sum(requests) FROM usage_rollups WHERE tenant_id = 'kill' "
                        "AND period = 'hour' AND dim = 'tenant'"
                    )
                )
                recorded = set(
                    (await conn.scalars(text("SELECT request_id FROM usage_records"))).all()
                )
        finally:
            await engine.dispose()
    finally:
        await second.stop()
    assert totals[0] == totals[4] == REQUESTS, totals  # all 20, no request id twice
    assert again == totals
    assert rollup == REQUESTS  # the rollups counted each once too
    assert recorded == ids
    assert not old.exists()  # adopted, emptied and removed


def _spooled(directory: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in directory.glob("seg-*.jsonl"))


def _record(i: int) -> UsageRecord:
    at_us = int(datetime.now(UTC).timestamp() * 1_000_000)
    return UsageRecord(
        request_id=f"req-{i}", at_us=at_us, tenant_id="t", key_id="k", end_user=None, model="m"
    )


def _orphan(root: Path, name: str, records: range, database: str | None = None) -> None:
    """A spool left as a dead process leaves it: segments on disk, its lock released."""
    spool = Spool(root / name, database=database)
    spool.open()
    for i in records:
        spool.append(_record(i))
        if i % 10 == 9:
            spool.rotate(needs_replay=False)
    spool.close(all_applied=False)


async def _ids(spool: Spool) -> list[str]:
    return [r.request_id for seg in spool.closed for r in await spool.read(seg)]


async def test_two_spools_opening_at_once_never_both_adopt_a_segment(tmp_path: Path) -> None:
    root = tmp_path / "usage-spool"
    for n in range(8):
        _orphan(root, f"port-{9000 + n}", range(n * 100, n * 100 + 30))
    spools = [Spool(root / f"port-{8000 + n}", root=root) for n in range(2)]
    start = threading.Barrier(len(spools))

    def open_(spool: Spool) -> None:
        start.wait()
        spool.open()

    await asyncio.gather(*(asyncio.to_thread(open_, s) for s in spools))
    taken = [await _ids(s) for s in spools]
    everything = [i for ids in taken for i in ids]
    assert len(everything) == len(set(everything)) == 8 * 30  # each record once, none lost
    assert sum(s.adopted for s in spools) == 8 * 4  # 3 full segments and an empty current one
    assert sorted(p.name for p in root.iterdir()) == ["port-8000", "port-8001"]
    for s in spools:
        s.close(all_applied=False)


async def test_a_live_spool_is_left_alone_and_a_dead_ones_remains_are_kept(
    tmp_path: Path,
) -> None:
    root = tmp_path / "usage-spool"
    live = Spool(root / "port-1", root=root)
    live.open()
    live.append(_record(1))
    _orphan(root, "port-2", range(10, 15))
    mine = Spool(root / "port-3", root=root)
    mine.open()
    assert sorted(await _ids(mine)) == [f"req-{i}" for i in range(10, 15)]
    assert all(seg.needs_replay for seg in mine.closed)
    assert (root / "port-1" / "lock").exists() and not (root / "port-2").exists()
    assert live.current is not None and live.current.path.exists()  # untouched
    live.close(all_applied=False)
    mine.close(all_applied=False)
    # the live one, once gone, is adopted by the next start (on yet another port)
    later = Spool(root / "port-4", root=root)
    later.open()
    ids = await _ids(later)
    assert "req-1" in ids and len(ids) == len(set(ids))
    later.close(all_applied=False)


async def test_a_spool_of_another_database_is_not_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    here = database_tag("sqlite+aiosqlite:///./var/kvgate.db")
    assert here == database_tag(f"sqlite+aiosqlite:///{tmp_path}/var/kvgate.db")
    assert database_tag("postgresql+asyncpg://u:pw@h/db") == database_tag(
        "postgresql+asyncpg://u:other@h/db?ssl=require"
    )  # the password and options are not the database
    there = database_tag("postgresql+asyncpg://u@h/db")
    root = tmp_path / "usage-spool"
    _orphan(root, "port-1", range(0, 3), database=there)
    _orphan(root, "port-2", range(3, 6), database=here)
    mine = Spool(root / "port-3", root=root, database=here)
    mine.open()
    assert sorted(await _ids(mine)) == ["req-3", "req-4", "req-5"]
    assert (root / "port-1").exists() and not (root / "port-2").exists()
    mine.close(all_applied=False)


def test_the_own_directory_waits_for_an_adopter_then_refuses_a_live_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spool whose directory another process holds fails to open after the wait (the
    message names the variable); the lock is a flock, so this holds within one process too."""
    monkeypatch.setattr("gateway.usage.spool.LOCK_WAIT_S", 0.2)
    holder = Spool(tmp_path / "port-1")
    holder.open()
    with pytest.raises(Exception, match="KVGATE_USAGE_SPOOL_DIR"):
        Spool(tmp_path / "port-1").open()
    holder.close(all_applied=False)
    again = Spool(tmp_path / "port-1")
    again.open()
    again.close(all_applied=True)
