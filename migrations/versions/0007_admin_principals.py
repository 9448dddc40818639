"""Admin principals: platform and tenant admins, editors and viewers, each with its own token.

Revision ID: 0007_admin_principals
Revises: 0005_fair_scheduling
Create Date: 2027-02-02

- ``admin_principals``: one row per admin token. ``tenant_id`` NULL is a platform admin (every
  tenant, the cluster, prices); else the admin of that one tenant (deleted with it). ``access``
  is ``editor`` or ``viewer``. Only the token's SHA-256 is stored (unique: the lookup key).
  ``expires_at`` NULL never expires; ``revoked_at`` set is refused from then on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_admin_principals"
down_revision = "0006_tenant_tools"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "admin_principals",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column(
            "tenant_id",
            sa.String(63),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=True,
        ),
        sa.Column("access", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("access IN ('editor', 'viewer')", name="ck_admin_principals_access"),
    )
    op.create_index("ix_admin_principals_tenant_id", "admin_principals", ["tenant_id"])


def downgrade() -> None:
    op.drop_index("ix_admin_principals_tenant_id", table_name="admin_principals")
    op.drop_table("admin_principals")
