"""Stored responses and conversations (the Responses and Conversations APIs).

Revision ID: 0010_conversations
Revises: 0009_sealed_secrets
Create Date: 2027-03-01

See tenants/conversation_models.py for the invariants. Adds ``conversations``, ``responses``
and ``conversation_items`` (each row owned by (tenant, owner); a tenant's rows go with it), and
two tenant settings: ``conversation_store`` (false forces ``store`` off) and
``conversation_retention_days`` (NULL: the gateway's KVGATE_CONVERSATION_RETENTION_DAYS).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tenants.models import BigIntPK, UTCDateTime

revision = "0010_conversations"
down_revision = "0009_sealed_secrets"
branch_labels = None
depends_on = None

ID = 64
OWNER = 300


def _tenant_fk() -> sa.Column[str]:
    return sa.Column(
        "tenant_id",
        sa.String(63),
        sa.ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    )


def _conversation_fk() -> sa.Column[str]:
    return sa.Column(
        "conversation_id",
        sa.String(ID),
        sa.ForeignKey("conversations.id", ondelete="CASCADE"),
        nullable=True,
    )


def _conversations() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(ID), primary_key=True),
        _tenant_fk(),
        sa.Column("owner", sa.String(OWNER), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("last_response_id", sa.String(ID), nullable=True),
        sa.Column("turns", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_conversations_owner", "conversations", ["tenant_id", "owner", "created_at"])
    op.create_index("ix_conversations_tenant_updated", "conversations", ["tenant_id", "updated_at"])


def _responses() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(ID), primary_key=True),
        _tenant_fk(),
        sa.Column("owner", sa.String(OWNER), nullable=False),
        _conversation_fk(),
        sa.Column("previous_response_id", sa.String(ID), nullable=True),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("prefix_digest", sa.String(64), nullable=True),
        sa.Column("tail_ids", sa.LargeBinary(), nullable=True),
    )
    op.create_index("ix_responses_owner", "responses", ["tenant_id", "owner", "created_at"])
    op.create_index("ix_responses_conversation", "responses", ["conversation_id", "created_at"])
    op.create_index("ix_responses_tenant_created", "responses", ["tenant_id", "created_at"])


def _items() -> None:
    op.create_table(
        "conversation_items",
        sa.Column("pk", BigIntPK, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(ID), nullable=False),
        _tenant_fk(),
        sa.Column("owner", sa.String(OWNER), nullable=False),
        _conversation_fk(),
        sa.Column(
            "response_id",
            sa.String(ID),
            sa.ForeignKey("responses.id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("direction", sa.String(8), nullable=False),
        sa.Column("type", sa.String(40), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "direction IN ('input', 'output')", name="ck_conversation_items_direction"
        ),
    )
    op.create_index(
        "ix_conversation_items_conversation", "conversation_items", ["conversation_id", "pk"]
    )
    op.create_index("ix_conversation_items_response", "conversation_items", ["response_id", "pk"])
    op.create_index(
        "ix_conversation_items_owner", "conversation_items", ["tenant_id", "owner", "id"]
    )


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(
            sa.Column("conversation_store", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch.add_column(sa.Column("conversation_retention_days", sa.Integer(), nullable=True))
    _conversations()
    _responses()
    _items()


def downgrade() -> None:
    op.drop_table("conversation_items")
    op.drop_table("responses")
    op.drop_table("conversations")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("conversation_retention_days")
        batch.drop_column("conversation_store")
