"""Widget max_choices: the most choices (``n``) one widget chat request may ask for.

Revision ID: 0003_widget_max_choices
Revises: 0002_wave2
Create Date: 2027-01-05

- ``tenants.widget_max_choices``: ``n`` of widget traffic (a widget key or its session tokens)
  is at most this (default 1: each choice is an engine request and a widget key is public).
  Server keys are not affected (they may ask for up to 128).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_widget_max_choices"
down_revision = "0002_wave2"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(
            sa.Column("widget_max_choices", sa.Integer(), nullable=False, server_default="1")
        )


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("widget_max_choices")
