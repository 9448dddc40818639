"""Operators' transcripts: a tenant's stored conversations listed and read (every read
audited in its own transaction), deleted by editors, and the tenant setting that turns reading
off (``tenants.transcripts_enabled``, migrations/versions/0011_*).

Units of work for ``TenantStore.write`` (a read writes its audit row, so reads are writes too).
Conversations are those of the conversation store (tenants/conversation_models.py), every owner
of the tenant; spend is the usage ledger's, by the request ids of the conversation's turns (a
stored response's id, or the chat completion a widget turn was, ``metadata.chat_completion_id``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.conversation_models import ConversationRow, ItemRow, ResponseRow
from tenants.errors import InvalidField, TenantNotFound, TenantStoreError
from tenants.models import Tenant
from tenants.queries import check_limit
from tenants.service import lock_tenant, write_audit
from tenants.transcript_schemas import (
    TranscriptAccessOut,
    TranscriptEntryOut,
    TranscriptOut,
    TranscriptPageOut,
    TranscriptSummaryOut,
)
from tenants.usage_models import UsageRecordRow

CHAT_ID_KEY = "chat_completion_id"  # a widget turn's chat completion, in the response metadata
NANOS = 1_000_000_000
CURSOR_SEP = "~"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TranscriptsDisabled(TenantStoreError):
    def __init__(self, tenant_id: str) -> None:
        super().__init__(
            f"transcript access is turned off for tenant {tenant_id!r} "
            "(PUT /admin/v1/tenants/{id}/transcript-access turns it on)"
        )


class TranscriptNotFound(TenantStoreError):
    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} not found", param="conversation_id")


# ---- the setting ---------------------------------------------------------------------------
async def _tenant(session: AsyncSession, tenant_id: str) -> Tenant:
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise TenantNotFound(tenant_id)
    return tenant


async def get_access(session: AsyncSession, tenant_id: str) -> TranscriptAccessOut:
    tenant = await _tenant(session, tenant_id)
    return TranscriptAccessOut(enabled=tenant.transcripts_enabled)


async def set_access(
    session: AsyncSession, tenant_id: str, enabled: bool, *, actor: str
) -> TranscriptAccessOut:
    tenant = await lock_tenant(session, tenant_id, allow_deleted=False)
    if tenant.transcripts_enabled != enabled:
        tenant.transcripts_enabled = enabled
        await session.flush()
        details = {"before": not enabled, "after": enabled}
        await write_audit(session, actor, "transcripts.set_access", tenant_id, details)
    return TranscriptAccessOut(enabled=enabled)


async def _readable(session: AsyncSession, tenant_id: str) -> Tenant:
    tenant = await _tenant(session, tenant_id)
    if not tenant.transcripts_enabled:
        raise TranscriptsDisabled(tenant_id)
    return tenant


# ---- reads (audited) -------------------------------------------------------------------------
def split_owner(owner: str) -> tuple[str, str]:
    """``user:alice`` -> (``user``, ``alice``); an owner without a kind is a user."""
    kind, sep, rest = owner.partition(":")
    return (kind, rest) if sep else ("user", owner)


def _cursor_of(row: ConversationRow) -> str:
    """Opaque and URL-safe: the row's start in microseconds since the epoch, and its id."""
    return f"{(row.created_at - EPOCH) // timedelta(microseconds=1)}{CURSOR_SEP}{row.id}"


def _cursor(raw: str) -> tuple[datetime, str]:
    stamp, sep, conv_id = raw.partition(CURSOR_SEP)
    if not (sep and conv_id and stamp.isdigit() and len(stamp) <= 18):
        raise InvalidField("cursor must be a cursor returned by this endpoint", param="cursor")
    return EPOCH + timedelta(microseconds=int(stamp)), conv_id


async def list_transcripts(
    session: AsyncSession,
    tenant_id: str,
    *,
    actor: str,
    limit: int = 50,
    cursor: str | None = None,
    end_user: str | None = None,
) -> TranscriptPageOut:
    """The tenant's conversations, newest first; ``end_user``: one owner's only."""
    check_limit(limit)
    await _readable(session, tenant_id)
    c = ConversationRow
    stmt = select(c).where(c.tenant_id == tenant_id)
    if end_user is not None:
        stmt = stmt.where(c.owner == end_user)
    if cursor:
        when, conv_id = _cursor(cursor)
        stmt = stmt.where(or_(c.created_at < when, and_(c.created_at == when, c.id < conv_id)))
    stmt = stmt.order_by(c.created_at.desc(), c.id.desc()).limit(limit + 1)
    rows = list((await session.scalars(stmt)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    spends = await _spends(session, tenant_id, [r.id for r in rows])
    details: dict[str, Any] = {"count": len(rows), "end_user": end_user, "cursor": cursor}
    await write_audit(session, actor, "transcripts.list", tenant_id, details)
    next_cursor = _cursor_of(rows[-1]) if more and rows else None
    return TranscriptPageOut(
        data=[_summary(r, spends.get(r.id, 0)) for r in rows], next_cursor=next_cursor
    )


async def read_transcript(
    session: AsyncSession, tenant_id: str, conversation_id: str, *, actor: str
) -> TranscriptOut:
    """One conversation with every item in order; the read is audited (who, which, whose)."""
    await _readable(session, tenant_id)
    row = await _conversation(session, tenant_id, conversation_id)
    items = await session.scalars(
        select(ItemRow).where(ItemRow.conversation_id == row.id).order_by(ItemRow.pk)
    )
    spends = await _spends(session, tenant_id, [row.id])
    details = {"conversation_id": row.id, "owner": row.owner}
    await write_audit(session, actor, "transcripts.read", tenant_id, details)
    return TranscriptOut(
        conversation=_summary(row, spends.get(row.id, 0)),
        entries=[_entry(i) for i in items],
    )


async def delete_transcript(
    session: AsyncSession, tenant_id: str, conversation_id: str, *, actor: str
) -> None:
    """Remove a conversation with its items and responses (allowed with reading turned off:
    deleting shows nothing)."""
    await _tenant(session, tenant_id)
    row = await _conversation(session, tenant_id, conversation_id)
    await session.execute(delete(ItemRow).where(ItemRow.conversation_id == row.id))
    await session.execute(delete(ResponseRow).where(ResponseRow.conversation_id == row.id))
    await session.execute(delete(ConversationRow).where(ConversationRow.id == row.id))
    details = {"conversation_id": row.id, "owner": row.owner}
    await write_audit(session, actor, "transcripts.delete", tenant_id, details)


async def _conversation(
    session: AsyncSession, tenant_id: str, conversation_id: str
) -> ConversationRow:
    row = await session.scalar(
        select(ConversationRow).where(
            ConversationRow.id == conversation_id, ConversationRow.tenant_id == tenant_id
        )
    )
    if row is None:
        raise TranscriptNotFound(conversation_id)
    return row


def _summary(row: ConversationRow, spend_nanos: int) -> TranscriptSummaryOut:
    kind, who = split_owner(row.owner)
    return TranscriptSummaryOut(
        id=row.id,
        end_user=who,
        owner_kind=kind,
        started_at=row.created_at,
        updated_at=row.updated_at,
        turns=row.turns,
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        total_tokens=row.input_tokens + row.output_tokens,
        spend_usd=spend_nanos / NANOS,
    )


def _entry(item: ItemRow) -> TranscriptEntryOut:
    data = item.data or {}
    role = str(data.get("role") or ("assistant" if item.type == "function_call" else "tool"))
    return TranscriptEntryOut(
        id=item.id, type=item.type, role=role, text=item_text(data), created_at=item.created_at
    )


def item_text(data: dict[str, Any]) -> str:
    """What an item says, as text: a message's text parts, a call's name and arguments, a
    tool's output (other parts are named, never rendered)."""
    kind = data.get("type")
    if kind == "function_call":
        return f"{data.get('name', '')}({data.get('arguments', '')})"
    if kind == "function_call_output":
        output = data.get("output", "")
        return output if isinstance(output, str) else str(output)
    content = data.get("content", "")
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, dict):
            text = part.get("text")
            parts.append(text if isinstance(text, str) else f"[{part.get('type', 'part')}]")
    return "".join(parts)


# ---- spend: the ledger's records of the conversations' turns --------------------------------
async def _spends(
    session: AsyncSession, tenant_id: str, conversation_ids: list[str]
) -> dict[str, int]:
    if not conversation_ids:
        return {}
    rows = await session.execute(
        select(ResponseRow.id, ResponseRow.conversation_id, ResponseRow.body).where(
            ResponseRow.tenant_id == tenant_id, ResponseRow.conversation_id.in_(conversation_ids)
        )
    )
    by_request: dict[str, str] = {}
    for resp_id, conv_id, body in rows:
        for request_id in _request_ids(resp_id, body):
            by_request[request_id] = conv_id
    if not by_request:
        return {}
    u = UsageRecordRow
    sums = await session.execute(
        select(u.request_id, func.sum(u.spend_nanos))
        .where(u.tenant_id == tenant_id, u.request_id.in_(list(by_request)))
        .group_by(u.request_id)
    )
    out: dict[str, int] = {}
    for request_id, total in sums:
        conv_id = by_request[request_id]
        out[conv_id] = out.get(conv_id, 0) + int(total or 0)
    return out


def _request_ids(response_id: str, body: Any) -> Iterable[str]:
    yield response_id
    meta = body.get("metadata") if isinstance(body, dict) else None
    chat_id = meta.get(CHAT_ID_KEY) if isinstance(meta, dict) else None
    if isinstance(chat_id, str):
        yield chat_id
