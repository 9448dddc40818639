"""Tenant tools: a prompt version carries tools; MCP servers of a tenant; the webhook secret.

Revision ID: 0006_tenant_tools
Revises: 0005_fair_scheduling
Create Date: 2027-02-03

- ``system_prompts.tools`` (JSON list of tool definitions, tenants/tools.py) and
  ``system_prompts.tool_options`` (``tool_choice``, ``max_tool_rounds``); NULL: no tools.
  Activating a version switches its text and its tools together.
- ``tenants.tool_secret``: the HMAC-SHA256 key of the tenant's webhook calls
  (docs/tools.md); NULL until the tenant first has one.
- ``usage_records.tool_calls``: tenant tool calls the gateway ran for the request.
- ``mcp_servers``: a tenant's MCP servers (url, optional bearer token) with the snapshot of
  the tools each listed when added.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_tenant_tools"
down_revision = "0005_fair_scheduling"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("system_prompts") as batch:
        batch.add_column(sa.Column("tools", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("tool_options", sa.JSON(), nullable=True))
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("tool_secret", sa.String(64), nullable=True))
    op.create_table(
        "mcp_servers",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "tenant_id",
            sa.String(63),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("bearer", sa.Text(), nullable=True),
        sa.Column("tools", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_mcp_servers_tenant_id", "mcp_servers", ["tenant_id"])
    # On PostgreSQL usage_records is partitioned: a column added to the parent reaches every
    # partition (batch mode is SQLite's table copy; PostgreSQL alters in place).
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("tool_calls", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("tool_calls")
    op.drop_index("ix_mcp_servers_tenant_id", table_name="mcp_servers")
    op.drop_table("mcp_servers")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("tool_secret")
    with op.batch_alter_table("system_prompts") as batch:
        batch.drop_column("tool_options")
        batch.drop_column("tools")
