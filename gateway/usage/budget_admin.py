"""Admin routes of budgets (in the admin sub-app, behind its bearer auth)::

    PUT /v1/tenants/{id}/budget                 {day?, month?, soft_threshold?, soft_webhook?}
    GET /v1/tenants/{id}/budget
    PUT /v1/tenants/{id}/keys/{key_id}/budget   the same, for one key (within the tenant's)
    GET /v1/tenants/{id}/keys/{key_id}/budget

A period is ``{max_tokens?, max_spend_usd?}`` (at least one); PUT replaces the whole budget (a
period left out or null has none). Effective at once in the gateway that answers, within
KVGATE budget refresh (5 s) in the others.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.usage.admin import _db, _tenant_exists, actor_of, read_json, usd
from gateway.usage.budgets import window
from gateway.usage.ledger import LEDGER, Ledger
from gateway.usage.prices import usd_to_nanos
from tenants.errors import KeyNotFound
from tenants.models import ApiKey
from tenants.schemas import parse
from tenants.service import write_audit
from tenants.usage_models import BUDGET_PERIODS, BudgetRow

# A spend ceiling's bound: 10^9 USD is 10^18 nano-USD, inside the ledger's 64-bit columns.
MAX_BUDGET_USD = Decimal(10**9)


class PeriodIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(default=None, ge=1, le=2**62)
    max_spend_usd: Decimal | None = Field(default=None, ge=0, le=MAX_BUDGET_USD)

    @model_validator(mode="after")
    def _one(self) -> PeriodIn:
        if self.max_tokens is None and self.max_spend_usd is None:
            raise ValueError("give max_tokens, max_spend_usd or both")
        return self


class BudgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    day: PeriodIn | None = None
    month: PeriodIn | None = None
    soft_threshold: float = Field(default=0.8, gt=0, le=1)
    soft_webhook: str | None = Field(default=None, max_length=2000, pattern=r"^https?://")


class PeriodOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    max_tokens: int | None
    max_spend_usd: float | None
    resets_at: str = Field(description="end of the current window, ISO 8601 UTC")


class BudgetOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    tenant_id: str
    key_id: str | None
    day: PeriodOut | None
    month: PeriodOut | None
    soft_threshold: float
    soft_webhook: str | None


def _period_audit(p: PeriodIn | None) -> dict[str, Any] | None:
    if p is None:
        return None
    spend = None if p.max_spend_usd is None else float(p.max_spend_usd)
    return {"max_tokens": p.max_tokens, "max_spend_usd": spend}


def _ledger(request: web.Request) -> Ledger:
    return request.app[LEDGER]


async def _check_key(request: web.Request, tenant: str, key_id: str) -> None:
    async with AsyncSession(_ledger(request).engine) as session:
        q = select(ApiKey.id).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant)
        if await _db(session.scalar(q)) is None:
            raise KeyNotFound(key_id)


async def _answer(request: web.Request, tenant: str, key_id: str) -> web.Response:
    ledger = _ledger(request)
    async with AsyncSession(ledger.engine) as session:
        q = select(BudgetRow).where(BudgetRow.tenant_id == tenant, BudgetRow.key_id == key_id)
        rows = (await _db(session.execute(q))).scalars().all()
    now = datetime.now(UTC)
    body: dict[str, Any] = {
        "tenant_id": tenant,
        "key_id": key_id or None,
        "day": None,
        "month": None,
        "soft_threshold": rows[0].soft_fraction if rows else 0.8,
        "soft_webhook": rows[0].soft_webhook if rows else None,
    }
    for r in rows:
        _, end, _ = window(r.period, now, ledger.settings.budget_timezone)
        body[r.period] = {
            "max_tokens": r.max_tokens,
            "max_spend_usd": usd(r.max_spend_nanos) if r.max_spend_nanos is not None else None,
            "resets_at": end.isoformat().replace("+00:00", "Z"),
        }
    return web.json_response(body)


async def _put(request: web.Request, tenant: str, key_id: str) -> web.Response:
    data = parse(BudgetIn, await read_json(request))
    ledger = _ledger(request)
    now = datetime.now(UTC)
    rows = []
    for period in BUDGET_PERIODS:
        p: PeriodIn | None = getattr(data, period)
        if p is None:
            continue
        spend = (
            None
            if p.max_spend_usd is None
            else usd_to_nanos(p.max_spend_usd, period, MAX_BUDGET_USD)
        )
        rows.append(
            BudgetRow(
                tenant_id=tenant,
                key_id=key_id,
                period=period,
                max_tokens=p.max_tokens,
                max_spend_nanos=spend,
                soft_fraction=data.soft_threshold,
                soft_webhook=data.soft_webhook,
                updated_at=now,
            )
        )

    actor = actor_of(request)
    audit = {  # never the webhook URL itself (it may carry a token): whether there is one
        "key_id": key_id or None,
        **{k: _period_audit(getattr(data, k)) for k in BUDGET_PERIODS},
        "soft_threshold": data.soft_threshold,
        "soft_webhook": data.soft_webhook is not None,
    }

    async def replace() -> None:
        async with AsyncSession(ledger.engine) as session, session.begin():
            await session.execute(
                delete(BudgetRow).where(BudgetRow.tenant_id == tenant, BudgetRow.key_id == key_id)
            )
            session.add_all(rows)
            await write_audit(session, actor, "budget.set", tenant, audit)

    await _db(replace())
    if ledger.budgets is not None:
        await _db(ledger.budgets.reload())
    return await _answer(request, tenant, key_id)


async def put_tenant_budget(request: web.Request) -> web.Response:
    tenant = request.match_info["id"]
    await _tenant_exists(request, tenant)
    return await _put(request, tenant, "")


async def get_tenant_budget(request: web.Request) -> web.Response:
    tenant = request.match_info["id"]
    await _tenant_exists(request, tenant)
    return await _answer(request, tenant, "")


async def put_key_budget(request: web.Request) -> web.Response:
    tenant, key_id = request.match_info["id"], request.match_info["key_id"]
    await _tenant_exists(request, tenant)
    await _check_key(request, tenant, key_id)
    return await _put(request, tenant, key_id)


async def get_key_budget(request: web.Request) -> web.Response:
    tenant, key_id = request.match_info["id"], request.match_info["key_id"]
    await _tenant_exists(request, tenant)
    await _check_key(request, tenant, key_id)
    return await _answer(request, tenant, key_id)


def add_budget_routes(app: web.Application) -> None:
    t = "/v1/tenants/{id}"
    app.router.add_routes(
        [
            web.put(f"{t}/budget", put_tenant_budget),
            web.get(f"{t}/budget", get_tenant_budget),
            web.put(f"{t}/keys/{{key_id}}/budget", put_key_budget),
            web.get(f"{t}/keys/{{key_id}}/budget", get_key_budget),
        ]
    )
