"""Secrets at rest: MCP servers' bearer tokens and tenants' tool signing secrets sealed under
the installation's secrets key (tenants/sealing.py).

Revision ID: 0009_sealed_secrets
Revises: 0008_budget_soft_webhook
Create Date: 2027-02-17

- ``secret_keys``: a row per key that sealed a stored secret (fingerprint, a probe sealed under
  it); the gateway's start-up check and ``kvgate secrets rotate`` keep it (tenants/secret_store.py).
- ``tenants.tool_secret`` becomes TEXT on PostgreSQL (a sealed value is ~190 characters; SQLite
  does not enforce a VARCHAR length, so its declared type stays).
- Upgrade seals every clear ``tenants.tool_secret`` and ``mcp_servers.bearer`` (one
  transaction with the schema change). Only then is a key needed: ``kvgate migrate`` and
  ``kvgate serve`` pass theirs; the ``alembic`` command line reads KVGATE_SECRETS_KEY (or, on
  SQLite, ``<KVGATE_VAR_DIR>/secrets.key``). A database with no secret stored needs none.
- Downgrade opens them again (the key is needed when any is stored) and drops ``secret_keys``.
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.engine import Connection

from tenants.models import utcnow
from tenants.sealing import PROBE, SecretBox, is_sealed
from tenants.secret_keys import SecretsSettings, load_box

revision = "0009_sealed_secrets"
down_revision = "0008_budget_soft_webhook"
branch_labels = None
depends_on = None

# The columns as this revision knows them (not the models, which move on).
SECRET_COLUMNS = (
    sa.table("tenants", sa.column("id", sa.String), sa.column("tool_secret", sa.Text)),
    sa.table("mcp_servers", sa.column("id", sa.String), sa.column("bearer", sa.Text)),
)


def _box(conn: Connection) -> SecretBox:
    settings = context.config.attributes.get("secrets")
    if not isinstance(settings, SecretsSettings):
        settings = SecretsSettings.from_env(os.environ, conn.engine.url.drivername)
    return load_box(settings)


def _stored(conn: Connection, table: sa.TableClause) -> list[tuple[str, str]]:
    key, value = table.c.id, list(table.c)[1]
    rows = conn.execute(sa.select(key, value).where(value.is_not(None))).all()
    return [(str(r[0]), str(r[1])) for r in rows]


def _rewrite(conn: Connection, table: sa.TableClause, values: dict[str, str]) -> None:
    key, value = table.c.id, list(table.c)[1]
    for row_id, new in values.items():
        conn.execute(sa.update(table).where(key == row_id).values({value.name: new}))


def upgrade() -> None:
    keys = op.create_table(
        "secret_keys",
        sa.Column("fingerprint", sa.String(16), primary_key=True),
        sa.Column("probe", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.alter_column("tenants", "tool_secret", type_=sa.Text(), existing_type=sa.String(64))
    clear = {t: {i: v for i, v in _stored(conn, t) if not is_sealed(v)} for t in SECRET_COLUMNS}
    if not any(clear.values()):
        return
    box = _box(conn)
    for table, values in clear.items():
        _rewrite(conn, table, {i: box.seal(v) for i, v in values.items()})
    row = {"fingerprint": box.current, "probe": box.seal(PROBE), "created_at": utcnow()}
    op.bulk_insert(keys, [row])


def downgrade() -> None:
    conn = op.get_bind()
    sealed = {t: {i: v for i, v in _stored(conn, t) if is_sealed(v)} for t in SECRET_COLUMNS}
    if any(sealed.values()):
        box = _box(conn)
        for table, values in sealed.items():
            _rewrite(conn, table, {i: box.unseal(v) for i, v in values.items()})
    if conn.dialect.name == "postgresql":
        op.alter_column("tenants", "tool_secret", type_=sa.String(64), existing_type=sa.Text())
    op.drop_table("secret_keys")
