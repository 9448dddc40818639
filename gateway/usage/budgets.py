"""Budgets per tenant and per key: tokens and/or spend per day or month, enforced at admission.

    admission: for every budget of the request's tenant and key, the window now (calendar day
      or month in KVGATE_BUDGET_TIMEZONE) -> one ``BudgetState.admit`` with the reservation
      (prompt + n * max_tokens tokens, their spend at the model's price, none of it cached)
      over: 429 ``budget_exceeded``, Retry-After = seconds until the window ends,
            ``x-budget-reset`` = that time (ISO 8601 UTC)
      a counter missing (Redis restarted): seeded from the ledger's hour rollups of the window,
            then admitted again
      state unknown (Redis or database down): 503 ``budget_unavailable``, or admitted without
            a reservation when KVGATE_BUDGET_FAIL_MODE=open
    completion (the usage record): ``settle`` adds used - reserved, off the request path
    soft threshold (a budget's ``soft_fraction``): the first admission that crosses it logs
      ``budget_soft_threshold``, counts ``kvgate_budget_soft_threshold_total`` and tells
      ``on_soft`` (gateway/chat/tools/run/budget_webhook.py: the budget's signed webhook, if it has
      one)

Definitions (table ``usage_budgets``) are held in memory, reloaded every few seconds and at once
in the gateway that changes them. Seeds read hour rollups, so a window that starts inside an
hour (time zones with a half-hour offset) is seeded from the whole hour it starts in, and
records still in a spool are not in a seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import structlog
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from gateway.errors import ApiError
from gateway.usage.budget_state import MISSING, OK, BudgetState, Take
from tenants.usage_models import BudgetRow, UsageRollupRow

log = structlog.get_logger("gateway.usage")


@dataclass(frozen=True)
class BudgetDef:
    tenant_id: str
    key_id: str  # "" for the tenant's budget
    period: str  # day | month
    max_tokens: int | None
    max_spend_nanos: int | None
    soft_fraction: float = 0.8
    soft_webhook: str | None = None

    @property
    def scope(self) -> str:
        return f"key:{self.key_id}" if self.key_id else "tenant"


def window(period: str, now: datetime, tz: ZoneInfo) -> tuple[datetime, datetime, str]:
    """[start, end) in UTC of the calendar day or month containing ``now`` in ``tz``."""
    local = now.astimezone(tz)
    if period == "day":
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        end = (start + timedelta(days=1, hours=2)).replace(hour=0)  # across DST changes
        label = f"d{start:%Y%m%d}"
    else:
        start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = (start + timedelta(days=32)).replace(day=1)
        label = f"m{start:%Y%m}"
    return start.astimezone(UTC), end.replace(tzinfo=tz).astimezone(UTC), label


@dataclass(frozen=True)
class SoftCrossing:
    """One admission that crossed a budget's soft threshold (tokens or spend, after it)."""

    budget: BudgetDef
    what: str  # tokens | spend
    used: int
    limit: int


@dataclass
class Reservation:
    takes: tuple[Take, ...]
    tokens: int
    spend: int


def budget_exceeded(d: BudgetDef, reset: datetime, now: datetime) -> ApiError:
    what = "tokens" if d.max_tokens is not None else "spend"
    retry = max(1, math.ceil((reset - now).total_seconds()))
    return ApiError(
        429,
        f"{d.period} budget of the {d.scope.split(':')[0]} exhausted ({what}); it resets at "
        f"{reset.isoformat().replace('+00:00', 'Z')}",
        type_="insufficient_quota",
        code="budget_exceeded",
        headers={
            "Retry-After": str(retry),
            "x-budget-reset": reset.isoformat().replace("+00:00", "Z"),
            "x-budget-scope": d.scope.split(":")[0],
        },
    )


def budget_unavailable() -> ApiError:
    return ApiError(
        503,
        "budget state cannot be read right now; retry shortly",
        type_="service_unavailable",
        code="budget_unavailable",
    )


class Budgets:
    def __init__(
        self,
        state: BudgetState,
        engine: AsyncEngine,
        prefix: str,
        tz: ZoneInfo,
        *,
        fail_open: bool = False,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.soft_crossed = Counter(
            "kvgate_budget_soft_threshold",
            "budget soft thresholds crossed (tenant, scope, period)",
            ["tenant", "scope", "period"],
            registry=registry,
        )
        self.state = state
        self.engine = engine
        self.prefix = prefix
        self.tz = tz
        self.fail_open = fail_open
        self.defs: dict[tuple[str, str], list[BudgetDef]] = {}
        # told of every soft threshold crossed (the gateway's webhook caller, set at start)
        self.on_soft: Callable[[SoftCrossing], None] | None = None

    async def reload(self) -> None:
        async with AsyncSession(self.engine) as session:
            rows = (await session.execute(select(BudgetRow))).scalars().all()
        defs: dict[tuple[str, str], list[BudgetDef]] = {}
        for r in rows:
            d = BudgetDef(
                r.tenant_id,
                r.key_id,
                r.period,
                r.max_tokens,
                r.max_spend_nanos,
                r.soft_fraction,
                r.soft_webhook,
            )
            defs.setdefault((r.tenant_id, r.key_id), []).append(d)
        self.defs = defs

    def applicable(self, tenant: str, key_id: str | None) -> list[BudgetDef]:
        out = list(self.defs.get((tenant, ""), ()))
        if key_id:
            out += self.defs.get((tenant, key_id), ())
        return out

    def _key(self, d: BudgetDef, label: str) -> str:
        return f"{self.prefix}bg:{{{d.tenant_id}}}:{d.scope}:{label}"

    async def reserve(
        self, tenant: str, key_id: str | None, tokens: int, spend: int
    ) -> Reservation | None:
        """Admit or raise (429 / 503); None when no budget applies (or failing open)."""
        defs = self.applicable(tenant, key_id)
        if not defs:
            return None
        now = datetime.now(UTC)
        spans = [window(d.period, now, self.tz) for d in defs]
        takes = tuple(
            Take(
                self._key(d, label),
                d.max_tokens,
                d.max_spend_nanos,
                tokens,
                spend,
                int((end - now).total_seconds() * 1000) + 86_400_000,
            )
            for d, (_, end, label) in zip(defs, spans, strict=True)
        )
        try:
            result = await self.state.admit(takes)
            if result.status == MISSING:
                await self._seed(defs, spans, takes)
                result = await self.state.admit(takes)
        except Exception as exc:
            log.warning("budget_state_unknown", tenant=tenant, error=type(exc).__name__)
            if self.fail_open:
                return None
            raise budget_unavailable() from None
        if result.status != OK:
            i = result.index
            raise budget_exceeded(defs[i], spans[i][1], now)
        self._soft(defs, takes, result.used)
        return Reservation(takes, tokens, spend)

    async def _seed(
        self,
        defs: Sequence[BudgetDef],
        spans: Sequence[tuple[datetime, datetime, str]],
        takes: Sequence[Take],
    ) -> None:
        seeds = []
        for d, (start, _, _), t in zip(defs, spans, takes, strict=True):
            tokens, spend = await self.used_from_rollups(d, start)
            seeds.append((t.key, tokens, spend, t.ttl_ms))
        await self.state.seed(seeds)

    async def used_from_rollups(self, d: BudgetDef, start: datetime) -> tuple[int, int]:
        r = UsageRollupRow
        hour = start.replace(minute=0, second=0, microsecond=0)
        q = select(
            func.coalesce(func.sum(r.prompt_tokens + r.completion_tokens), 0),
            func.coalesce(func.sum(r.spend_nanos), 0),
        ).where(
            r.tenant_id == d.tenant_id,
            r.period == "hour",
            r.dim == ("key" if d.key_id else "tenant"),
            r.value == d.key_id,
            r.bucket >= hour,
        )
        async with AsyncSession(self.engine) as session:
            tokens, spend = (await session.execute(q)).one()
        return int(tokens), int(spend)

    def _soft(
        self, defs: Sequence[BudgetDef], takes: Sequence[Take], used: Sequence[tuple[int, int]]
    ) -> None:
        for d, t, (ut, us) in zip(defs, takes, used, strict=True):
            for what, limit, after, delta in (
                ("tokens", d.max_tokens, ut, t.tokens),
                ("spend", d.max_spend_nanos, us, t.spend),
            ):
                if limit is None:
                    continue
                mark = d.soft_fraction * limit
                if after - delta < mark <= after:
                    self._crossed(SoftCrossing(d, what, after, limit))

    def _crossed(self, c: SoftCrossing) -> None:
        d = c.budget
        self.soft_crossed.labels(d.tenant_id, d.scope.split(":")[0], d.period).inc()
        log.warning(
            "budget_soft_threshold",
            tenant=d.tenant_id,
            scope=d.scope,
            period=d.period,
            what=c.what,
            used=c.used,
            limit=c.limit,
        )
        if self.on_soft is not None:
            self.on_soft(c)

    async def settle(self, res: Reservation, tokens: int, spend: int) -> None:
        deltas = [(t.key, tokens - res.tokens, spend - res.spend) for t in res.takes]
        try:
            await self.state.settle(deltas)
        except Exception as exc:  # the counter keeps the reservation: errs on the safe side
            log.warning("budget_settle_failed", error=type(exc).__name__)

    async def close(self) -> None:
        await self.state.close()
