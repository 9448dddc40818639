"""Admin routes of the usage ledger (in the admin sub-app, behind its bearer auth)::

    GET    /v1/tenants/{id}/usage?start=&end=&group_by=hour|day|key|end_user|model
           [&limit=&cursor=][&format=csv]
    GET    /v1/usage?start=&end=&group_by=tenant|hour|day|key|end_user|model[...]
    GET    /v1/tenants/{id}/usage/records?start=&end=[&limit=&cursor=][&format=csv]
    GET    /v1/prices                    the price table (config and admin prices)
    PUT    /v1/prices/{model}            {input, cached_input?, output} USD per 1M tokens
    DELETE /v1/prices/{model}            back to the configured price (or none)

Times are ISO 8601; a time without an offset is UTC; answers are UTC (``Z``). ``start`` and
``end`` must be whole hours (the rollups' grain); ``end`` defaults to the next whole hour,
``start`` to 24 hours before ``end``. CSV columns: reports ``group, requests, prompt_tokens,
cached_tokens, completion_tokens, total_tokens, spend_usd``; records those of
``reports.RECORD_COLUMNS``. CSV holds every row of the range (no pagination); text cells are
quoted and a formula-like start is neutralized (gateway/usage/csv_out.py).
"""

from __future__ import annotations

import io
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from aiohttp import web
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.errors import ApiError
from gateway.usage import reports
from gateway.usage.api_models import PriceIn
from gateway.usage.csv_out import write_csv
from gateway.usage.ledger import LEDGER, Ledger
from gateway.usage.prices import NANOS, parse_price
from tenants.db import is_unavailable, unavailable
from tenants.errors import InvalidField, TenantNotFound
from tenants.models import Tenant
from tenants.schemas import parse

T = TypeVar("T")
MAX_PAGE = 1000
MAX_RANGE = timedelta(days=400)


def _ledger(request: web.Request) -> Ledger:
    return request.app[LEDGER]


def _time(request: web.Request, name: str, default: datetime) -> datetime:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidField(f"{name}: not an ISO 8601 time", param=name) from None
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    if t.minute or t.second or t.microsecond:
        raise InvalidField(f"{name}: must be a whole hour (UTC)", param=name)
    return t


def time_range(request: web.Request) -> tuple[datetime, datetime]:
    now = datetime.now(UTC)
    end = _time(request, "end", now.replace(minute=0, second=0, microsecond=0) + reports.HOUR)
    start = _time(request, "start", end - timedelta(days=1))
    if start >= end:
        raise InvalidField("start must be before end", param="start")
    if end - start > MAX_RANGE:
        raise InvalidField(f"a range covers at most {MAX_RANGE.days} days", param="end")
    return start, end


def _limit(request: web.Request, default: int = 100) -> int:
    raw = request.query.get("limit", str(default))
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
        raise InvalidField(f"limit must be an integer from 1 to {MAX_PAGE}", param="limit")
    return int(raw)


def _cursor(request: web.Request) -> str | None:
    raw = request.query.get("cursor") or None
    if raw is not None:
        try:
            reports.decode_cursor(raw)
        except ValueError:
            raise InvalidField("cursor: not a cursor of this API", param="cursor") from None
    return raw


def _csv(request: web.Request) -> bool:
    fmt = request.query.get("format", "json")
    if fmt not in ("json", "csv"):
        raise InvalidField("format must be json or csv", param="format")
    return fmt == "csv"


async def _db(work: Awaitable[T]) -> T:
    """A database that cannot answer is a 503 (``database_unavailable``), never a 500."""
    try:
        return await work
    except Exception as exc:
        if is_unavailable(exc):
            raise unavailable(exc) from exc
        raise


def usd(nanos: int) -> float:
    return float(Decimal(nanos) / NANOS)


def group_body(g: reports.Group) -> dict[str, Any]:
    t = g.totals
    return {
        "group": g.group,
        "requests": t.requests,
        "prompt_tokens": t.prompt_tokens,
        "cached_tokens": t.cached_tokens,
        "completion_tokens": t.completion_tokens,
        "total_tokens": t.prompt_tokens + t.completion_tokens,
        "spend_usd": usd(t.spend_nanos),
        "spend_nanos": t.spend_nanos,
    }


REPORT_CSV = (
    "group",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "total_tokens",
    "spend_usd",
)


def _csv_response(
    columns: tuple[str, ...] | list[str], rows: list[dict[str, Any]], name: str
) -> web.Response:
    buf = io.StringIO()
    write_csv(buf, columns, rows)  # text cells neutralized for spreadsheets (csv_out.py)
    headers = {"Content-Disposition": f'attachment; filename="{name}.csv"'}
    return web.Response(text=buf.getvalue(), content_type="text/csv", headers=headers)


# Who an audit row names: the calling admin principal (set by gateway/app.py from the admin
# context, gateway/admin/context.py, which this package does not import).
AUDIT_ACTOR: web.AppKey[Callable[[], str]] = web.AppKey("usage_audit_actor")


def actor_of(request: web.Request) -> str:
    return request.app[AUDIT_ACTOR]()


async def read_json(request: web.Request) -> Any:
    """The JSON body; anything that is not JSON text is a 400."""
    try:
        return json.loads(await request.read())
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        raise ApiError(400, "request body is not valid JSON") from None


async def _tenant_exists(request: web.Request, tenant_id: str) -> None:
    """404 for a tenant that never existed (a deleted one keeps its usage)."""
    async with AsyncSession(_ledger(request).engine) as session:
        found = await _db(session.scalar(select(Tenant.id).where(Tenant.id == tenant_id)))
    if found is None:
        raise TenantNotFound(tenant_id)


async def _report(
    request: web.Request, tenant: str | None, allowed: tuple[str, ...]
) -> web.Response:
    group_by = request.query.get("group_by", "day")
    if group_by not in allowed:
        raise InvalidField(f"group_by must be one of {', '.join(allowed)}", param="group_by")
    start, end = time_range(request)
    as_csv = _csv(request)
    limit = None if as_csv else _limit(request)
    cursor = None if as_csv else _cursor(request)
    if tenant is not None:
        await _tenant_exists(request, tenant)
    page = await _db(
        reports.report(
            _ledger(request).engine,
            start=start,
            end=end,
            group_by=group_by,
            tenant=tenant,
            limit=limit,
            cursor=cursor,
        )
    )
    data = [group_body(g) for g in page.groups]
    if as_csv:
        return _csv_response(REPORT_CSV, data, f"usage-{tenant or 'all'}-{group_by}")
    body = {
        "object": "usage_report",
        "tenant_id": tenant,
        "group_by": group_by,
        "start": reports._iso(start),
        "end": reports._iso(end),
        "data": data,
        "next_cursor": page.next_cursor,
    }
    return web.json_response(body)


async def tenant_usage(request: web.Request) -> web.Response:
    return await _report(request, request.match_info["id"], reports.TENANT_GROUPS)


async def all_usage(request: web.Request) -> web.Response:
    return await _report(request, None, reports.GLOBAL_GROUPS)


async def tenant_records(request: web.Request) -> web.Response:
    tenant = request.match_info["id"]
    start, end = time_range(request)
    as_csv = _csv(request)
    await _tenant_exists(request, tenant)
    engine = _ledger(request).engine
    if not as_csv:
        page = await _db(
            reports.records(
                engine, tenant, start=start, end=end, limit=_limit(request), cursor=_cursor(request)
            )
        )
        return web.json_response(
            {"object": "list", "data": page.rows, "next_cursor": page.next_cursor}
        )
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await _db(
            reports.records(engine, tenant, start=start, end=end, limit=MAX_PAGE, cursor=cursor)
        )
        rows.extend(page.rows)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    return _csv_response(list(reports.RECORD_COLUMNS), rows, f"usage-records-{tenant}")


# -- prices ------------------------------------------------------------------------------------
def _price_body(model: str, price: Any, source: str) -> dict[str, Any]:
    return {"model": model, **price.as_usd(), "source": source}


async def list_prices(request: web.Request) -> web.Response:
    table = _ledger(request).prices.table()
    data = [_price_body(m, p, src) for m, (p, src) in sorted(table.items())]
    return web.json_response({"object": "list", "data": data})


async def put_price(request: web.Request) -> web.Response:
    model = request.match_info["model"]
    if not 1 <= len(model) <= 200:
        raise InvalidField("model: 1 to 200 characters", param="model")
    body = parse(PriceIn, await read_json(request))
    price = parse_price(body.model_dump(exclude_none=True), "price")
    ledger = _ledger(request)
    await _db(ledger.prices.store(ledger.engine, model, price, actor=actor_of(request)))
    return web.json_response(_price_body(model, price, "admin"))


async def delete_price(request: web.Request) -> web.Response:
    ledger = _ledger(request)
    model = request.match_info["model"]
    await _db(ledger.prices.store(ledger.engine, model, None, actor=actor_of(request)))
    return web.Response(status=204)


def add_usage_routes(app: web.Application) -> None:
    t = "/v1/tenants/{id}"
    app.router.add_routes(
        [
            web.get(f"{t}/usage", tenant_usage),
            web.get(f"{t}/usage/records", tenant_records),
            web.get("/v1/usage", all_usage),
            web.get("/v1/prices", list_prices),
            web.put("/v1/prices/{model}", put_price),
            web.delete("/v1/prices/{model}", delete_price),
        ]
    )
