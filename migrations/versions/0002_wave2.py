"""Wave 2 columns: per-key limits, widget settings and sessions, per-visitor limits.

Revision ID: 0002_wave2
Revises: 0001_initial
Create Date: 2026-11-30

- ``api_keys.rpm / tpm / max_concurrency``: a key's own limits, applied within its tenant's
  (NULL = only the tenant's limits apply).
- ``tenants.widget_*``: what the embeddable widget shows (title, greeting, accent colour), whether a
  widget may only be used with an end-user session token, the per-tenant HMAC secret that signs
  session tokens (rotating it revokes every token), and whether widget traffic may send its own
  system / developer messages (off unless the tenant allows it explicitly).
- ``tenants.visitor_*``: limits per end user (session user, else client address) of widget traffic
  (NULL = the gateway default).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_wave2"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

KEY_LIMITS = ("rpm", "tpm", "max_concurrency")
VISITOR_LIMITS = ("visitor_rpm", "visitor_tpm", "visitor_max_concurrency")


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        for name in KEY_LIMITS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("widget_title", sa.String(200), nullable=True))
        batch.add_column(sa.Column("widget_greeting", sa.Text(), nullable=True))
        batch.add_column(sa.Column("widget_accent", sa.String(32), nullable=True))
        batch.add_column(
            sa.Column(
                "widget_require_session", sa.Boolean(), nullable=False, server_default=sa.false()
            )
        )
        batch.add_column(sa.Column("widget_session_secret", sa.String(64), nullable=True))
        batch.add_column(
            sa.Column(
                "widget_allow_client_system",
                sa.Boolean(),
                nullable=False,
                server_default=sa.false(),
            )
        )
        for name in VISITOR_LIMITS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        for name in (
            "widget_title",
            "widget_greeting",
            "widget_accent",
            "widget_require_session",
            "widget_session_secret",
            "widget_allow_client_system",
            *VISITOR_LIMITS,
        ):
            batch.drop_column(name)
    with op.batch_alter_table("api_keys") as batch:
        for name in KEY_LIMITS:
            batch.drop_column(name)
