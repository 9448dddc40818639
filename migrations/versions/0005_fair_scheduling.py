"""Fair scheduling: a tenant's weight in its limits, a key's priority class.

Revision ID: 0005_fair_scheduling
Revises: 0004_usage_ledger
Create Date: 2027-01-27

- ``tenants.weight``: the tenant's fair share of the engine (engine/core/fairness.py: service
  proportional to it while tenants compete); NULL: 1.
- ``api_keys.priority``: ``interactive`` (default) or ``batch`` (uses the capacity interactive
  requests leave free, within the starvation bound of docs/contracts.md).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_fair_scheduling"
down_revision = "0004_usage_ledger"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("weight", sa.Float(), nullable=True))
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(
            sa.Column("priority", sa.String(16), nullable=False, server_default="interactive")
        )
        batch.create_check_constraint(
            "ck_api_keys_priority", "priority IN ('interactive', 'batch')"
        )


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_constraint("ck_api_keys_priority", type_="check")
        batch.drop_column("priority")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("weight")
