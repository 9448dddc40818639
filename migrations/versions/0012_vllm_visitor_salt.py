"""A tenant setting: a per-visitor cache salt on the vLLM backend.

Revision ID: 0012_vllm_visitor_salt
Revises: 0011_widget_history_transcripts
Create Date: 2026-12-07

- ``tenants.vllm_visitor_salt``: through vLLM (``KVGATE_BACKEND=vllm``), each request carries a
  cache salt per visitor instead of the tenant's (off by default: visitors of a tenant share
  cached blocks there; docs/contracts.md, "Through vLLM"). kvgate's own engine ignores it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_vllm_visitor_salt"
down_revision = "0011_widget_history_transcripts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(
            sa.Column("vllm_visitor_salt", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("vllm_visitor_salt")
