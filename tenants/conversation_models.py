"""SQLAlchemy models of stored conversations and responses (migrations/versions/0010_*).

Every row carries its owner: ``(tenant_id, owner)``, where ``owner`` is the end-user identity
the gateway derives for the prefix-cache scope (gateway/chat/cache_scope.py: ``user:<id>``,
``addr:<visitor>``, ``key:<key id>``). Reads filter on both, so an id another owner created is
"not found" (tenants/conversations.py holds the one place that builds those filters).

- ``conversations``: OpenAI's Conversation object (id, metadata, created_at) plus the counters an
  operator reads (turns, tokens) and the last response of the conversation (the warm tail).
- ``responses``: a stored Response; ``body`` is the object as the API returned it. ``tail_ids``
  are the turn's token ids after the tenant's prefix (the prompt, then the generated tokens,
  little-endian uint32), valid while ``prefix_digest`` names the prefix they followed: the next
  turn's prompt starts with exactly these ids, so it hits the KV cache up to its new input.
- ``conversation_items``: items (messages, function calls and outputs) in insertion order
  (``pk``). An item belongs to a conversation, a response (``direction``: its ``input`` or its
  ``output``), or both.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from tenants.models import Base, BigIntPK, UTCDateTime, utcnow

ID_MAX = 64  # characters of a conversation, response or item id
OWNER_MAX = 300  # characters of an owner identity ("user:" + a 256-character end user, ...)
DIRECTIONS = ("input", "output")


class ConversationRow(Base):
    __tablename__ = "conversations"
    __table_args__ = (
        Index("ix_conversations_owner", "tenant_id", "owner", "created_at"),
        Index("ix_conversations_tenant_updated", "tenant_id", "updated_at"),
    )

    id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    owner: Mapped[str] = mapped_column(String(OWNER_MAX))
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_response_id: Mapped[str | None] = mapped_column(String(ID_MAX), nullable=True)
    turns: Mapped[int] = mapped_column(Integer, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class ResponseRow(Base):
    __tablename__ = "responses"
    __table_args__ = (
        Index("ix_responses_owner", "tenant_id", "owner", "created_at"),
        Index("ix_responses_conversation", "conversation_id", "created_at"),
        Index("ix_responses_tenant_created", "tenant_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(ID_MAX), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    owner: Mapped[str] = mapped_column(String(OWNER_MAX))
    conversation_id: Mapped[str | None] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), nullable=True
    )
    previous_response_id: Mapped[str | None] = mapped_column(String(ID_MAX), nullable=True)
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    model: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    prefix_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    tail_ids: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


class ItemRow(Base):
    __tablename__ = "conversation_items"
    __table_args__ = (
        CheckConstraint("direction IN ('input', 'output')", name="ck_conversation_items_direction"),
        Index("ix_conversation_items_conversation", "conversation_id", "pk"),
        Index("ix_conversation_items_response", "response_id", "pk"),
        Index("ix_conversation_items_owner", "tenant_id", "owner", "id"),
    )

    pk: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(ID_MAX))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    owner: Mapped[str] = mapped_column(String(OWNER_MAX))
    conversation_id: Mapped[str | None] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), nullable=True
    )
    response_id: Mapped[str | None] = mapped_column(
        ForeignKey("responses.id", ondelete="SET NULL"), nullable=True
    )
    direction: Mapped[str] = mapped_column(String(8), default="input")
    type: Mapped[str] = mapped_column(String(40))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


# Children first (clearing in this order never breaks a foreign key).
CONVERSATION_TABLES = ("conversation_items", "responses", "conversations")
