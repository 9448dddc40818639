"""The widget's conversation on the server, and operators' access to transcripts.

Revision ID: 0011_widget_history_transcripts
Revises: 0010_conversations
Create Date: 2026-12-07

- ``tenants.widget_history``: the widget keeps each session-token visitor's conversation in the
  conversation store (off by default: a tenant opts in).
- ``tenants.transcripts_enabled``: operators may list and read the tenant's stored
  conversations in the console and the admin API (on by default; off refuses both).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_widget_history_transcripts"
down_revision = "0010_conversations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(
            sa.Column("widget_history", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(
            sa.Column("transcripts_enabled", sa.Boolean(), nullable=False, server_default=sa.true())
        )


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("transcripts_enabled")
        batch.drop_column("widget_history")
