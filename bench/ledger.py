"""``kvgate bench ledger``: the usage ledger's costs.

1. records/s sustained on PostgreSQL: ``--procs`` processes, each the ledger of one gateway
   (its own spool, ``Recorder`` and ``LedgerWriter``, as ``kvgate serve`` runs them), record
   synthetic requests as fast as they can for ``--seconds``; the rate is what landed in the
   database (records and their rollups) per second, all processes together.
2. request-path cost: what a chat request pays for its record (the record built, one spool
   ``write``), p50 / p99 over ``--calls`` records, and the background flush's loop time per
   record (it runs on the gateway's event loop between requests).
3. report time: rollups of a month of ``--month-records`` records (spread over keys, end users
   and models; made directly as rollups, the writer would take hours), then the tenant's report
   by day and by key over the month, median of 20.
4. chat p50 with the ledger on vs off, interleaved pairs against two in-process gateways with
   the demo model (bench/ledger_chat.py); ``--only chat`` runs just this part.
Writes bench/results/ledger.json. Uses a fresh database on the server of ``--pg`` (dropped after).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate bench ledger", description=__doc__)
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--month-records", type=int, default=10_000_000)
    p.add_argument("--out", type=Path, default=RESULTS / "ledger.json")
    p.add_argument("--chat-pairs", type=int, default=200, help="chat pairs (on, off) per repeat")
    p.add_argument("--chat-repeats", type=int, default=3)
    p.add_argument(
        "--only",
        choices=["chat"],
        help="run only this part; the other fields of --out are kept as they are",
    )
    return p.parse_args(list(argv))


def _record(i: int, tenant: str, at_us: int) -> object:
    from gateway.usage.record import UsageRecord

    return UsageRecord(
        request_id=f"{tenant}-{uuid.uuid4().hex}",
        at_us=at_us,
        tenant_id=tenant,
        key_id=f"key_{i % 20:016x}",
        end_user=f"user-{i % 500}",
        model="bench-model",
        prompt_tokens=800,
        cached_tokens=640,
        completion_tokens=120,
        choices=1,
        stream=True,
        ttft_ms=40.0,
        duration_ms=900.0,
        prompt_version=3,
        spend_nanos=123_456,
    )


async def _writer_proc(url: str, spool: str, seconds: float, idx: int) -> int:
    from gateway.usage.recorder import Recorder
    from gateway.usage.spool import Spool
    from gateway.usage.writer import LedgerWriter
    from tenants.db import make_engine

    engine = make_engine(url, timeout_s=30, pool_size=2, max_overflow=0)
    sp = Spool(Path(spool))
    sp.open()
    rec = Recorder(sp, LedgerWriter(engine), flush_s=0.1, batch_size=500, deadline_s=30)
    rec.start()
    tenant = f"bench-{idx % 2}"  # two processes per tenant: rollup rows are contended
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        for _ in range(200):
            i += 1
            rec.record(_record(i, tenant, time.time_ns() // 1000))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # let the flusher run, as a gateway's loop would
        while len(rec._pending) > 5000:  # the database is the bound: do not run away
            await asyncio.sleep(0.01)
    await rec.close(deadline_s=60)
    await engine.dispose()
    return rec.applied


def _proc_main(url: str, spool: str, seconds: float, idx: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    out.put(asyncio.run(_writer_proc(url, spool, seconds, idx)))


def _throughput(url: str, procs: int, seconds: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        ps = [
            ctx.Process(target=_proc_main, args=(url, f"{tmp}/spool{i}", seconds, i, q))
            for i in range(procs)
        ]
        t0 = time.perf_counter()
        for p in ps:
            p.start()
        applied = [q.get() for _ in ps]
        for p in ps:
            p.join()
        wall = time.perf_counter() - t0
    total = sum(applied)
    return {"records": total, "seconds": round(wall, 2), "records_per_s": round(total / wall)}


def _request_path(calls: int) -> dict[str, float]:
    from gateway.usage.spool import Spool

    with tempfile.TemporaryDirectory() as tmp:
        sp = Spool(Path(tmp))
        sp.open()
        times = []
        for i in range(calls):
            t0 = time.perf_counter()
            sp.append(_record(i, "t", time.time_ns() // 1000))  # type: ignore[arg-type]
            times.append(time.perf_counter() - t0)
        sp.close(all_applied=True)
    times.sort()
    return {
        "p50_us": round(times[len(times) // 2] * 1e6, 2),
        "p99_us": round(times[int(len(times) * 0.99)] * 1e6, 2),
    }


async def _flush_loop_time(url: str, n: int = 20000) -> float:
    """Loop (CPU) time the flusher spends per record: a batch's encode + statements."""
    from gateway.usage.writer import LedgerWriter
    from tenants.db import make_engine

    engine = make_engine(url)
    w = LedgerWriter(engine)
    recs = [_record(i, "flush", time.time_ns() // 1000) for i in range(n)]
    t0 = time.process_time()
    for i in range(0, n, 500):
        await w.apply(recs[i : i + 500])  # type: ignore[arg-type]
    per = (time.process_time() - t0) / n
    await engine.dispose()
    return round(per * 1e6, 2)


async def _reports(url: str, month_records: int) -> dict[str, float]:
    from sqlalchemy import insert

    from gateway.usage import reports
    from tenants.db import make_engine
    from tenants.usage_models import UsageRollupRow

    engine = make_engine(url)
    start = datetime(2027, 1, 1, tzinfo=UTC)
    keys, users, models = 50, 2000, 3
    per_hour = month_records // (31 * 24)
    rows = []
    for h in range(31 * 24):
        bucket = start + timedelta(hours=h)
        for dim, values in (("tenant", [""]), ("key", range(keys)), ("model", range(models))):
            for v in values:
                share = per_hour // len(values)
                rows.append(("hour", dim, bucket, str(v), share))
        for u in range(h * 37 % users, h * 37 % users + 100):  # 100 active end users an hour
            rows.append(("hour", "end_user", bucket, f"user-{u % users}", per_hour // 100))
    for d in range(31):
        bucket = start + timedelta(days=d)
        for dim, n in (("tenant", 1), ("key", keys), ("model", models), ("end_user", users)):
            for v in range(n):
                rows.append(
                    ("day", dim, bucket, "" if dim == "tenant" else str(v), per_hour * 24 // n)
                )
    table = UsageRollupRow.__table__
    async with engine.begin() as conn:
        for i in range(0, len(rows), 5000):
            await conn.execute(
                insert(table),
                [
                    {"tenant_id": "month", "period": p, "dim": dim, "bucket": b, "value": v,
                     "requests": c, "prompt_tokens": c * 800, "cached_tokens": c * 640,
                     "completion_tokens": c * 120, "spend_nanos": c * 123_456}
                    for p, dim, b, v, c in rows[i : i + 5000]
                ],
            )  # fmt: skip
        await conn.exec_driver_sql("ANALYZE usage_rollups")
    out: dict[str, float] = {"rollup_rows": len(rows)}
    end = start + timedelta(days=31)
    for group_by in ("day", "key", "hour", "end_user"):
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            await reports.report(engine, start=start, end=end, group_by=group_by, tenant="month")
            times.append(time.perf_counter() - t0)
        out[f"by_{group_by}_ms"] = round(statistics.median(times) * 1000, 2)
    await engine.dispose()
    return out


def main(argv: Sequence[str]) -> int:
    import asyncpg

    from bench.ledger_chat import chat_p50
    from tenants.migrate import upgrade_to_head

    args = _parse(argv)
    name = f"kvgate_bench_ledger_{uuid.uuid4().hex[:8]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(args.pg)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    url = args.pg.replace("postgresql://", "postgresql+asyncpg://").rsplit("/", 1)[0] + "/" + name
    try:
        asyncio.run(upgrade_to_head(url))
        chat = asyncio.run(chat_p50(url, pairs=args.chat_pairs, repeats=args.chat_repeats))
        if args.only == "chat":
            result = json.loads(args.out.read_text()) if args.out.exists() else {}
            result["chat_p50"] = chat
            return _write(result, args.out)
        result = {
            "config": {
                "procs": args.procs,
                "seconds": args.seconds,
                "batch": 500,
                "flush_s": 0.1,
                "cpus": os.cpu_count(),
                "machine": platform.machine(),
                "python": platform.python_version(),
                "note": "shared, busy 2-core machine; PostgreSQL on the same host",
            },
            "throughput": _throughput(url, args.procs, args.seconds),
            "request_path": _request_path(args.calls),
            "flush_loop_us_per_record": asyncio.run(_flush_loop_time(url)),
            "reports": asyncio.run(_reports(url, args.month_records)),
            "chat_p50": chat,
        }
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    return _write(result, args.out)


def _write(result: dict[str, object], out: Path) -> int:
    print(json.dumps(result, indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0
