"""Prices per model and the spend of one request, in integer nano-USD.

A price is USD per million tokens for input, cached input and output, held as nano-USD per
million tokens (``Price``); ``prompt_tokens`` includes the cached ones (OpenAI's usage), so

    spend = ((prompt - cached) * input + cached * cached_input + completion * output) / 10**6

rounded half up to a nano-USD, per record. Configured prices (``KVGATE_USAGE_PRICES``: JSON, or
``@path`` to a JSON file, ``{"model": {"input": 0.15, "cached_input": 0.075, "output": 0.6}}``)
are overridden by prices set through the admin API (table ``model_prices``), which every
gateway reloads every ``refresh_s``. A model without a price costs 0 (its tokens still count).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from tenants.service import write_audit
from tenants.usage_models import ModelPriceRow

NANOS = 10**9
MILLION = 10**6
MAX_USD_PER_M = Decimal(1_000_000)  # a bound that keeps every product inside 64 bits


@dataclass(frozen=True)
class Price:
    input: int  # nano-USD per million tokens
    cached_input: int
    output: int

    def spend(self, prompt: int, cached: int, completion: int) -> int:
        cached = min(cached, prompt)
        total = (prompt - cached) * self.input + cached * self.cached_input
        total += completion * self.output
        return (total + MILLION // 2) // MILLION

    def as_usd(self) -> dict[str, float]:
        return {k: v / NANOS for k, v in self.__dict__.items()}


ZERO = Price(0, 0, 0)


def usd_to_nanos(value: Any, name: str, limit: Decimal = MAX_USD_PER_M) -> int:
    """USD (a JSON number or decimal string) -> integer nano-USD, exact to 9 decimals; at most
    ``limit`` USD (a price per 1M tokens by default)."""
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{name}: not a number") from None
    if not d.is_finite() or d < 0 or d > limit:
        raise ValueError(f"{name}: must be a number from 0 to {limit}")
    return int((d * NANOS).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def parse_price(body: Any, where: str) -> Price:
    if not isinstance(body, dict) or not {"input", "output"} <= set(body):
        raise ValueError(f"{where}: expected {{input, cached_input?, output}} in USD per 1M")
    extra = set(body) - {"input", "cached_input", "output"}
    if extra:
        raise ValueError(f"{where}: unknown field {sorted(extra)[0]!r}")
    inp = usd_to_nanos(body["input"], f"{where}.input")
    cached = usd_to_nanos(body.get("cached_input", body["input"]), f"{where}.cached_input")
    return Price(inp, cached, usd_to_nanos(body["output"], f"{where}.output"))


def parse_price_table(raw: str) -> dict[str, Price]:
    """``KVGATE_USAGE_PRICES``: inline JSON, or ``@path`` to a JSON file."""
    if not raw:
        return {}
    text = Path(raw[1:]).read_text() if raw.startswith("@") else raw
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object of model -> price")
    return {str(model): parse_price(p, str(model)) for model, p in data.items()}


class PriceBook:
    def __init__(self, configured: dict[str, Price]) -> None:
        self.configured = dict(configured)
        self._stored: dict[str, Price] = {}

    def price(self, model: str) -> Price:
        return self._stored.get(model) or self.configured.get(model) or ZERO

    def table(self) -> dict[str, tuple[Price, str]]:
        out = {m: (p, "config") for m, p in self.configured.items()}
        out.update({m: (p, "admin") for m, p in self._stored.items()})
        return out

    async def reload(self, engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as session:
            rows = (await session.execute(select(ModelPriceRow))).scalars().all()
        self._stored = {
            r.model: Price(r.input_nanos_per_m, r.cached_input_nanos_per_m, r.output_nanos_per_m)
            for r in rows
        }

    async def store(
        self, engine: AsyncEngine, model: str, price: Price | None, *, actor: str
    ) -> None:
        """Set (or with None remove) the admin price of ``model``, with its audit row
        (``price.set`` / ``price.delete`` by ``actor``) in the same transaction; effective here
        at once."""
        table = cast(Table, ModelPriceRow.__table__)  # a declarative class: its Table
        async with AsyncSession(engine) as session, session.begin():
            details: dict[str, object] = {"model": model}
            if price is not None:
                details.update(price.as_usd())
            action = "price.delete" if price is None else "price.set"
            await write_audit(session, actor, action, None, details)
            if price is None:
                await session.execute(table.delete().where(table.c.model == model))
            else:
                ins = (postgresql if engine.dialect.name == "postgresql" else sqlite).insert
                values = {
                    "model": model,
                    "input_nanos_per_m": price.input,
                    "cached_input_nanos_per_m": price.cached_input,
                    "output_nanos_per_m": price.output,
                    "updated_at": datetime.now(UTC),
                }
                stmt = ins(table).values(values)
                stmt = stmt.on_conflict_do_update(index_elements=["model"], set_=values)
                await session.execute(stmt)
        if price is None:
            self._stored.pop(model, None)
        else:
            self._stored[model] = price
