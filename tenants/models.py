"""SQLAlchemy models: the schema of the tenant store (created by migrations, never create_all).

Invariants:
- ``tenants.active_prompt_version`` is the one active system prompt of a tenant; it is NULL
  exactly when the tenant has no prompt, else any existing ``system_prompts.version`` of that
  tenant (set-prompt makes the new, highest version active; activation makes any existing
  version active: rollback or roll forward). Both first claim the tenant row with an
  ``UPDATE ... RETURNING`` (a row lock on PostgreSQL, the write lock on SQLite), so concurrent
  changes serialize and versions stay 1, 2, 3, ... without gaps or duplicates.
- ``api_keys`` holds the public prefix and the SHA-256 of the full key, never the key itself.
- ``tenants.cache_salt`` is a secret engine namespace; no API response or log contains it.
- ``tenants.tool_secret`` and ``mcp_servers.bearer`` hold sealed values only ("kvs1:..."), and
  every key that sealed one has its row in ``secret_keys`` (tenants/secret_store.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

TENANT_STATUSES = ("active", "suspended", "deleted")
KEY_KINDS = ("server", "widget")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite returns naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# SQLite only auto-increments an INTEGER PRIMARY KEY.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Tenant(Base):
    __tablename__ = "tenants"
    __table_args__ = (
        CheckConstraint("status IN ('active', 'suspended', 'deleted')", name="ck_tenants_status"),
    )

    id: Mapped[str] = mapped_column(String(63), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default="active")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    cache_salt: Mapped[str] = mapped_column(String(64))
    allow_client_system: Mapped[bool] = mapped_column(Boolean, default=True)
    active_prompt_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_output_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The engine's fair-share weight (migrations/versions/0005_*; NULL: 1.0).
    weight: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The embeddable widget (see migrations/versions/0002_wave2.py).
    widget_title: Mapped[str | None] = mapped_column(String(200), nullable=True)
    widget_greeting: Mapped[str | None] = mapped_column(Text, nullable=True)
    widget_accent: Mapped[str | None] = mapped_column(String(32), nullable=True)
    widget_require_session: Mapped[bool] = mapped_column(Boolean, default=False)
    widget_session_secret: Mapped[str | None] = mapped_column(String(64), nullable=True)
    widget_allow_client_system: Mapped[bool] = mapped_column(Boolean, default=False)
    # The most choices (n) of one widget chat request (migrations/versions/0003_*).
    widget_max_choices: Mapped[int] = mapped_column(Integer, default=1)
    # The widget's conversation kept on the server per end user (migrations/versions/0011_*).
    widget_history: Mapped[bool] = mapped_column(Boolean, default=False)
    # Operators may list and read the tenant's stored conversations (0011_*).
    transcripts_enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    # Limits per end user of widget traffic (NULL: the gateway default).
    visitor_rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    visitor_tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    visitor_max_concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # HMAC-SHA256 key of the tenant's webhook tool calls (migrations/versions/0006_*), sealed
    # under the secrets key (tenants/sealing.py; 0009_*).
    tool_secret: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Stored responses and conversations (migrations/versions/0010_*): False forces ``store``
    # off for every request; the retention in days (NULL: KVGATE_CONVERSATION_RETENTION_DAYS).
    conversation_store: Mapped[bool] = mapped_column(Boolean, default=True)
    conversation_retention_days: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Through vLLM, a cache salt per visitor instead of the tenant's (migrations/versions/0012_*).
    vllm_visitor_salt: Mapped[bool] = mapped_column(Boolean, default=False)


class ApiKey(Base):
    __tablename__ = "api_keys"
    __table_args__ = (
        CheckConstraint("kind IN ('server', 'widget')", name="ck_api_keys_kind"),
        CheckConstraint("priority IN ('interactive', 'batch')", name="ck_api_keys_priority"),
        Index("ix_api_keys_tenant_id", "tenant_id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    prefix: Mapped[str] = mapped_column(String(32), unique=True)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    allowed_origins: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The key's own limits, applied within the tenant's (NULL: only the tenant's apply).
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The engine's priority class of this key's requests (batch: capacity interactive leaves).
    priority: Mapped[str] = mapped_column(String(16), default="interactive")


class SystemPrompt(Base):
    __tablename__ = "system_prompts"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_by: Mapped[str] = mapped_column(String(200))
    # The version's tools (tenants/tools.py) and how the gateway uses them; NULL: none.
    tools: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    tool_options: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class McpServer(Base):
    """A tenant's MCP server and the tools it listed when added (a snapshot)."""

    __tablename__ = "mcp_servers"
    __table_args__ = (Index("ix_mcp_servers_tenant_id", "tenant_id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text)
    bearer: Mapped[str | None] = mapped_column(Text, nullable=True)  # sealed; never returned
    tools: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AuditLog(Base):
    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_tenant_id_id", "tenant_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(64))
    # Not a foreign key: audit rows outlive anything they describe.
    tenant_id: Mapped[str | None] = mapped_column(String(63), nullable=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class AdminPrincipal(Base):
    """An admin token's holder (migrations/versions/0007_*): ``tenant_id`` NULL is a platform
    admin, else the admin of that tenant; only the token's SHA-256 is kept."""

    __tablename__ = "admin_principals"
    __table_args__ = (
        CheckConstraint("access IN ('editor', 'viewer')", name="ck_admin_principals_access"),
        Index("ix_admin_principals_tenant_id", "tenant_id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True
    )
    access: Mapped[str] = mapped_column(String(16))
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_by: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class SecretKey(Base):
    """A key that may have sealed a stored secret (migrations/versions/0009_*): its fingerprint
    and a probe sealed under it, which only that key opens (tenants/secret_store.py)."""

    __tablename__ = "secret_keys"

    fingerprint: Mapped[str] = mapped_column(String(16), primary_key=True)
    probe: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


# Children first (clearing tables in this order never breaks a foreign key).
ALL_TABLES = (
    "secret_keys",
    "audit_log",
    "admin_principals",
    "mcp_servers",
    "system_prompts",
    "api_keys",
    "tenants",
)
