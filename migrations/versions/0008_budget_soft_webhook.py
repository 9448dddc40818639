"""Budget soft-threshold webhooks: the URL a tenant's budget calls when it crosses its soft
threshold (signed with the tenant's tool secret, docs/operations.md).

Revision ID: 0008_budget_soft_webhook
Revises: 0007_admin_principals
Create Date: 2027-02-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_budget_soft_webhook"
down_revision = "0007_admin_principals"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_budgets") as batch:
        batch.add_column(sa.Column("soft_webhook", sa.String(2000), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_budgets") as batch:
        batch.drop_column("soft_webhook")
