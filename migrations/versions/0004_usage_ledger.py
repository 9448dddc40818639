"""Usage ledger: per-request records, hourly and daily rollups, model prices, budgets.

Revision ID: 0004_usage_ledger
Revises: 0003_widget_max_choices
Create Date: 2027-01-20

See tenants/usage_models.py for the invariants. On PostgreSQL ``usage_records`` is a
declaratively partitioned table (``PARTITION BY RANGE (at)``) without partitions: the gateway
creates each month's partition before the first record of that month lands
(gateway/usage/partitions.py), and retention drops them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tenants.models import UTCDateTime

revision = "0004_usage_ledger"
down_revision = "0003_widget_max_choices"
branch_labels = None
depends_on = None


def _counters() -> list[sa.Column[int]]:
    return [
        sa.Column(name, sa.BigInteger(), nullable=False)
        for name in ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")
    ]


def upgrade() -> None:
    op.create_table(
        "usage_records",
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(63), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("end_user", sa.String(256), nullable=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("choices", sa.Integer(), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("error", sa.String(64), nullable=True),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("prompt_version", sa.Integer(), nullable=True),
        sa.Column("spend_nanos", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("request_id", "at", name="pk_usage_records"),
        postgresql_partition_by="RANGE (at)",
    )
    op.create_index(
        "ix_usage_records_tenant_at", "usage_records", ["tenant_id", "at", "request_id"]
    )
    op.create_table(
        "usage_rollups",
        sa.Column("tenant_id", sa.String(63), nullable=False),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("dim", sa.String(16), nullable=False),
        sa.Column("bucket", UTCDateTime(), nullable=False),
        sa.Column("value", sa.String(256), nullable=False),
        *_counters(),
        sa.Column("spend_nanos", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_id", "period", "dim", "bucket", "value", name="pk_usage_rollups"
        ),
    )
    op.create_index(
        "ix_usage_rollups_period_dim_bucket", "usage_rollups", ["period", "dim", "bucket"]
    )
    op.create_table(
        "model_prices",
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("input_nanos_per_m", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_nanos_per_m", sa.BigInteger(), nullable=False),
        sa.Column("output_nanos_per_m", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "usage_budgets",
        sa.Column("tenant_id", sa.String(63), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("max_tokens", sa.BigInteger(), nullable=True),
        sa.Column("max_spend_nanos", sa.BigInteger(), nullable=True),
        sa.Column("soft_fraction", sa.Float(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "key_id", "period", name="pk_usage_budgets"),
    )


def downgrade() -> None:
    op.drop_table("usage_budgets")
    op.drop_table("model_prices")
    op.drop_index("ix_usage_rollups_period_dim_bucket", table_name="usage_rollups")
    op.drop_table("usage_rollups")
    op.drop_index("ix_usage_records_tenant_at", table_name="usage_records")
    op.drop_table("usage_records")  # PostgreSQL: its partitions go with it
