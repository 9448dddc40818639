"""``kvgate usage ...``: the ledger's reports on the command line, read from the database.

    kvgate usage report  [--tenant ID] --start T [--end T] [--group-by day] [--csv]
                         the admin API's rows (total_tokens, spend_usd; its CSV columns)
    kvgate usage records --tenant ID --start T [--end T] [--limit N] [--csv]
    kvgate usage trim    [--retention-days N]     apply KVGATE_USAGE_RETENTION_DAYS now

The database is ``--database-url`` or KVGATE_DATABASE_URL (default: the embedded SQLite file).
Times as in the admin API (ISO 8601, whole hours, UTC when no offset). Exit codes: 0 ok, 1 the
database failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from gateway.settings import Settings
from gateway.usage import reports
from gateway.usage.admin import REPORT_CSV, group_body
from gateway.usage.csv_out import write_csv
from gateway.usage.writer import LedgerWriter
from tenants.db import make_engine


def _time(raw: str | None, default: datetime) -> datetime:
    if not raw:
        return default
    t = datetime.fromisoformat(raw)
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    if t.minute or t.second or t.microsecond:
        raise ValueError(f"{raw}: must be a whole hour")
    return t


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvgate usage", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("report", "records", "trim"):
        s = sub.add_parser(name)
        s.add_argument("--database-url", help="database URL (default: KVGATE_DATABASE_URL)")
        if name == "trim":
            s.add_argument("--retention-days", type=int, help="default KVGATE_USAGE_RETENTION_DAYS")
            continue
        s.add_argument("--tenant", required=name == "records")
        s.add_argument("--start")
        s.add_argument("--end")
        s.add_argument("--csv", action="store_true", help="CSV instead of JSON lines")
        if name == "report":
            s.add_argument("--group-by", default="day", choices=reports.GLOBAL_GROUPS)
        else:
            s.add_argument("--limit", type=int, default=1000)
    return p


def _write(
    rows: list[dict[str, object]], as_csv: bool, columns: Sequence[str] | None = None
) -> None:
    if as_csv:
        if rows:
            # text cells neutralized (csv_out.py)
            write_csv(sys.stdout, list(columns or rows[0]), rows)
        return
    for row in rows:
        print(json.dumps(row, default=str))


async def _run(args: argparse.Namespace) -> int:
    settings = Settings.from_env(os.environ)  # the variables as `kvgate serve` reads them
    url = args.database_url or settings.tenants.database_url
    engine = make_engine(url)
    try:
        if args.cmd == "trim":
            days = args.retention_days or settings.usage.retention_days or 0
            if days < 1:
                print("kvgate usage trim: no retention configured", file=sys.stderr)
                return 2
            print(f"trimmed {await LedgerWriter(engine, days).trim()}")
            return 0
        now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + reports.HOUR
        end = _time(args.end, now)
        start = _time(args.start, end - timedelta(days=1))
        if args.cmd == "report":
            page = await reports.report(
                engine, start=start, end=end, group_by=args.group_by, tenant=args.tenant, limit=None
            )
            # the admin API's rows: with total_tokens and spend_usd (CSV: the API's columns)
            rows: list[dict[str, object]] = [group_body(g) for g in page.groups]
            columns: Sequence[str] | None = REPORT_CSV
        else:
            rows, columns = [], None
            cursor = None
            while len(rows) < args.limit:
                rp = await reports.records(
                    engine, args.tenant, start=start, end=end, limit=1000, cursor=cursor
                )
                rows += rp.rows
                if rp.next_cursor is None:
                    break
                cursor = rp.next_cursor
            rows = rows[: args.limit]
        _write(rows, args.csv, columns)
        return 0
    finally:
        await engine.dispose()


def main(argv: Sequence[str]) -> int:
    try:
        args = _parser().parse_args(list(argv[1:]))
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return asyncio.run(_run(args))
    except ValueError as exc:
        print(f"kvgate usage: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"kvgate usage: database unavailable: {exc}", file=sys.stderr)
        return 1
