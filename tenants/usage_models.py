"""SQLAlchemy models of the usage ledger (created by migrations/versions/0004_usage_ledger.py).

- ``usage_records``: one row per authenticated chat request. Unique on (request_id, at): the
  primary key of a PostgreSQL table partitioned by range of ``at`` must hold the partition key,
  and a record's ``at`` travels with it through the spool, so a replayed record conflicts with
  itself and is skipped (``ON CONFLICT DO NOTHING``). On PostgreSQL the table is partitioned by
  month (``usage_records_pYYYYMM``, made on demand by gateway/usage/partitions.py); retention
  drops whole partitions. On SQLite it is one table, trimmed in batches.
- ``usage_rollups``: sums per (tenant, period, dimension, bucket, value), where period is
  ``hour`` or ``day`` (UTC buckets) and the dimension ``tenant`` (value ""), ``key``,
  ``end_user`` or ``model``. Every record adds to 8 rows (4 dimensions x 2 periods) in the
  transaction that inserts it, and only when it was inserted (RETURNING), so reports read sums
  that match the records exactly and never scan records.
- ``model_prices``: USD per million tokens, held as integer nano-USD per million tokens
  (``*_nanos_per_m``; 0.15 USD -> 150_000_000) so spend is exact integer arithmetic.
- ``usage_budgets``: a tenant's (``key_id`` "") or a key's limit per period (day, month).
Spend everywhere is integer nano-USD (``spend_nanos``; 1 USD = 10**9).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Float, Index, Integer, PrimaryKeyConstraint, String
from sqlalchemy.orm import Mapped, mapped_column

from tenants.models import Base, UTCDateTime

END_USER_MAX = 256  # characters of an end-user id kept in the ledger
PERIODS = ("hour", "day")
DIMENSIONS = ("tenant", "key", "end_user", "model")
BUDGET_PERIODS = ("day", "month")


class UsageRecordRow(Base):
    __tablename__ = "usage_records"
    __table_args__ = (
        PrimaryKeyConstraint("request_id", "at", name="pk_usage_records"),
        Index("ix_usage_records_tenant_at", "tenant_id", "at", "request_id"),
        {"postgresql_partition_by": "RANGE (at)"},
    )

    request_id: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(UTCDateTime())  # the request's arrival (UTC)
    tenant_id: Mapped[str] = mapped_column(String(63))
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    end_user: Mapped[str | None] = mapped_column(String(END_USER_MAX), nullable=True)
    model: Mapped[str] = mapped_column(String(200))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    choices: Mapped[int] = mapped_column(Integer)
    stream: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[int] = mapped_column(Integer)  # the HTTP status (499: client went away)
    outcome: Mapped[str] = mapped_column(String(16))  # answered | refused | cancelled | ...
    error: Mapped[str | None] = mapped_column(String(64), nullable=True)
    finish_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    ttft_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    duration_ms: Mapped[float] = mapped_column(Float)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    prompt_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    spend_nanos: Mapped[int] = mapped_column(BigInteger)
    # Tenant tool calls the gateway ran for the request (migrations/versions/0006_*).
    tool_calls: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class UsageRollupRow(Base):
    __tablename__ = "usage_rollups"
    __table_args__ = (
        PrimaryKeyConstraint(
            "tenant_id", "period", "dim", "bucket", "value", name="pk_usage_rollups"
        ),
        Index("ix_usage_rollups_period_dim_bucket", "period", "dim", "bucket"),
    )

    tenant_id: Mapped[str] = mapped_column(String(63))
    period: Mapped[str] = mapped_column(String(8))
    dim: Mapped[str] = mapped_column(String(16))
    bucket: Mapped[datetime] = mapped_column(UTCDateTime())
    value: Mapped[str] = mapped_column(String(END_USER_MAX))
    requests: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    spend_nanos: Mapped[int] = mapped_column(BigInteger)


class ModelPriceRow(Base):
    __tablename__ = "model_prices"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    input_nanos_per_m: Mapped[int] = mapped_column(BigInteger)
    cached_input_nanos_per_m: Mapped[int] = mapped_column(BigInteger)
    output_nanos_per_m: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class BudgetRow(Base):
    __tablename__ = "usage_budgets"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "key_id", "period", name="pk_usage_budgets"),
    )

    tenant_id: Mapped[str] = mapped_column(String(63))
    key_id: Mapped[str] = mapped_column(String(32))  # "" for the tenant's own budget
    period: Mapped[str] = mapped_column(String(8))  # day | month
    max_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_spend_nanos: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    soft_fraction: Mapped[float] = mapped_column(Float)
    # called (signed, gateway/chat/tools/run/budget_webhook.py) when the soft threshold is crossed
    soft_webhook: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


USAGE_TABLES = ("usage_records", "usage_rollups", "model_prices", "usage_budgets")
