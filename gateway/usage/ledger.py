"""``Ledger``: what the gateway holds of the usage ledger (built in ``create_app``, opened in
``cleanup_ctx``): the spool and recorder, the price book, the writer's own connection pool,
and a maintenance task (price reload, retention).

The ledger writes through a pool of its own (two connections), so batches never wait behind
request-path reads of the tenant store, nor the other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ratelimit import make_client
from gateway.usage.budget_state import BudgetState, MemoryBudgetState, RedisBudgetState
from gateway.usage.budgets import Budgets, Reservation
from gateway.usage.config import UsageSettings
from gateway.usage.prices import PriceBook
from gateway.usage.record import UsageRecord
from gateway.usage.recorder import Recorder
from gateway.usage.spool import Spool, database_tag
from gateway.usage.writer import LedgerWriter
from tenants.db import make_engine

log = structlog.get_logger("gateway.usage")

TRIM_EVERY_S = 3600.0


class Ledger:
    def __init__(
        self,
        settings: UsageSettings,
        database_url: str,
        *,
        redis_url: str | None = None,
        redis_prefix: str = "kvgate:",
        redis_timeout_s: float = 0.25,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        pool = {} if database_url.startswith("sqlite") else {"pool_size": 2, "max_overflow": 2}
        self.engine: AsyncEngine = make_engine(
            database_url, timeout_s=settings.db_deadline_s, **pool
        )
        self.writer = LedgerWriter(self.engine, settings.retention_days)
        self.spool = Spool(
            settings.spool_dir,
            settings.segment_bytes,
            settings.spool_root,
            database_tag(database_url),
        )
        self.prices = PriceBook(settings.prices)
        self.recorder = Recorder(
            self.spool,
            self.writer,
            flush_s=settings.flush_s,
            batch_size=settings.batch_size,
            retry_s=settings.retry_s,
            deadline_s=settings.db_deadline_s,
        )
        state: BudgetState = (
            RedisBudgetState(make_client(redis_url, redis_timeout_s))
            if redis_url
            else MemoryBudgetState()
        )
        self.budgets: Budgets | None = Budgets(
            state,
            self.engine,
            redis_prefix,
            settings.budget_timezone,
            fail_open=settings.budget_fail_open,
            registry=registry,
        )
        # spend as requests complete (the dashboard's spend panel; the ledger's rows are exact)
        self.spend_usd = Counter(
            "kvgate_usage_spend_usd",
            "spend of completed chat requests in USD, at the model's price (tenant, model)",
            ["tenant", "model"],
            registry=registry,
        )
        self._settling: set[asyncio.Task[None]] = set()
        self._maintenance: asyncio.Task[None] | None = None
        self.started = False

    def record(self, rec: UsageRecord) -> None:
        if self.started:
            self.recorder.record(rec)
            if rec.spend_nanos:
                self.spend_usd.labels(rec.tenant_id, rec.model).inc(rec.spend_nanos / 1e9)

    def spend(self, model: str, prompt: int, cached: int, completion: int) -> int:
        return self.prices.price(model).spend(prompt, cached, completion)

    def settle(self, res: Reservation, tokens: int, spend: int) -> None:
        """Reconcile a budget reservation with what the request used (in the background)."""
        if self.budgets is None:
            return
        task = asyncio.create_task(self.budgets.settle(res, tokens, spend))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def start(self) -> None:
        """Open the spool (on a thread: file work, a lock wait), adopting the spools of gateways
        that are gone (replay of all they left starts with the first tick), and the background
        tasks. A database that is down does not stop the start."""
        await asyncio.to_thread(self.spool.open)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._reload(), self.settings.db_deadline_s)
        self.recorder.start()
        self._maintenance = asyncio.create_task(self._maintain(), name="usage-maintenance")
        self.started = True

    async def _reload(self) -> None:
        await self.prices.reload(self.engine)
        if self.budgets is not None:
            await self.budgets.reload()

    async def _maintain(self) -> None:
        next_trim = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.budget_refresh_s)
            try:
                await self._reload()
                if time.monotonic() >= next_trim:
                    next_trim = time.monotonic() + TRIM_EVERY_S
                    removed = await self.writer.trim()
                    if removed:
                        log.info("usage_retention_trimmed", removed=removed)
            except Exception as exc:  # the database may be down: next round
                log.warning("usage_maintenance_failed", error=type(exc).__name__)

    async def close(self) -> None:
        self.started = False
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        if self._settling:
            await asyncio.wait(set(self._settling), timeout=2.0)
        if self.spool.current is not None:
            await self.recorder.close()
        if self.budgets is not None:
            await self.budgets.close()
        await self.engine.dispose()


LEDGER = web.AppKey("usage_ledger", Ledger)
