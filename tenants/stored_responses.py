"""Stored responses (scoped by (tenant, owner)), the chain behind ``previous_response_id``,
deletion of everything one owner stored, and retention. Each function takes the caller's session.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.conversation_models import ConversationRow, ItemRow, ResponseRow
from tenants.conversation_records import (
    ItemRecord,
    NewResponse,
    Order,
    OwnerScope,
    Page,
    Purged,
    ResponseNotFound,
    ResponseRecord,
    Scope,
    TenantScope,
    pack_ids,
)
from tenants.conversations import (
    add_items,
    conv_where,
    conversation_row,
    delete_conversations,
    item_page,
    item_rows,
    resp_where,
    response_row,
    rowcount,
)
from tenants.models import Tenant

MAX_CHAIN = 1000  # responses walked back through previous_response_id


# -- responses --------------------------------------------------------------------------------
async def _bump_conversation(session: AsyncSession, new: NewResponse) -> None:
    assert new.conversation_id is not None
    row = await conversation_row(session, new.scope, new.conversation_id)
    row.last_response_id = new.id
    row.updated_at = new.created_at
    row.turns += 1
    row.input_tokens += new.input_tokens
    row.output_tokens += new.output_tokens


async def save_response(session: AsyncSession, new: NewResponse) -> ResponseRecord:
    """The response and its items in one transaction (the conversation's counters with them)."""
    if new.conversation_id is not None:
        await _bump_conversation(session, new)
    row = ResponseRow(
        id=new.id,
        tenant_id=new.scope.tenant_id,
        owner=new.scope.owner,
        conversation_id=new.conversation_id,
        previous_response_id=new.previous_response_id,
        key_id=new.key_id,
        model=new.model,
        status=new.status,
        created_at=new.created_at,
        body=new.body,
        input_tokens=new.input_tokens,
        output_tokens=new.output_tokens,
        cached_tokens=new.cached_tokens,
        prefix_digest=None if new.tail is None else new.tail.prefix_digest,
        tail_ids=None if new.tail is None else pack_ids(new.tail.ids),
    )
    session.add(row)
    await session.flush()
    common: dict[str, Any] = {
        "conversation_id": new.conversation_id,
        "response_id": new.id,
        "at": new.created_at,
    }
    rows = item_rows(new.scope, new.inputs, direction="input", **common)
    rows += item_rows(new.scope, new.outputs, direction="output", **common)
    await add_items(session, rows)
    return ResponseRecord.of(row)


async def get_response(session: AsyncSession, scope: Scope, response_id: str) -> ResponseRecord:
    return ResponseRecord.of(await response_row(session, scope, response_id))


async def delete_response(session: AsyncSession, scope: Scope, response_id: str) -> None:
    """The response and its items; items it added to a conversation stay there."""
    row = await response_row(session, scope, response_id)
    await session.execute(
        delete(ItemRow).where(ItemRow.response_id == row.id, ItemRow.conversation_id.is_(None))
    )
    await session.execute(
        update(ItemRow).where(ItemRow.response_id == row.id).values(response_id=None)
    )
    await session.execute(
        update(ConversationRow)
        .where(ConversationRow.last_response_id == row.id)
        .values(last_response_id=None)
    )
    await session.execute(delete(ResponseRow).where(ResponseRow.id == row.id))


async def list_input_items(
    session: AsyncSession,
    scope: Scope,
    response_id: str,
    *,
    limit: int = 20,
    after: str | None = None,
    order: Order = "desc",
) -> Page:
    await response_row(session, scope, response_id)
    where = [ItemRow.response_id == response_id, ItemRow.direction == "input"]
    return await item_page(session, where, limit=limit, after=after, order=order)


async def response_history(
    session: AsyncSession, scope: Scope, response_id: str
) -> tuple[ItemRecord, ...]:
    """The inputs and outputs of ``response_id`` and of every response before it (through
    ``previous_response_id``, while stored), oldest first."""
    chain: list[str] = []
    current: str | None = response_id
    while current is not None and len(chain) < MAX_CHAIN:
        try:
            row = await response_row(session, scope, current)
        except ResponseNotFound:
            if not chain:
                raise
            break
        chain.append(row.id)
        current = row.previous_response_id
    stmt = select(ItemRow).where(ItemRow.response_id.in_(chain))
    rows = (await session.execute(stmt)).scalars().all()
    rank = {rid: i for i, rid in enumerate(reversed(chain))}
    ordered = sorted(rows, key=lambda r: (rank[r.response_id or ""], r.pk))
    return tuple(ItemRecord.of(r) for r in ordered)


# -- deletion and retention -------------------------------------------------------------------
async def delete_owner(session: AsyncSession, tenant_id: str, owner: str) -> Purged:
    """Everything one owner (an end user) stored in one tenant."""
    scope = OwnerScope(tenant_id, owner)
    ids = (await session.execute(select(ConversationRow.id).where(*conv_where(scope)))).scalars()
    purged = await delete_conversations(session, list(ids))
    items = await session.execute(
        delete(ItemRow).where(ItemRow.tenant_id == tenant_id, ItemRow.owner == owner)
    )
    resps = await session.execute(delete(ResponseRow).where(*resp_where(scope)))
    return purged + Purged(0, rowcount(resps), rowcount(items))


async def _purge_tenant(session: AsyncSession, tenant_id: str, cutoff: datetime) -> Purged:
    scope = TenantScope(tenant_id)
    old = select(ConversationRow.id).where(*conv_where(scope), ConversationRow.updated_at < cutoff)
    purged = await delete_conversations(session, list((await session.execute(old)).scalars()))
    old_resps = select(ResponseRow.id).where(
        *resp_where(scope), ResponseRow.conversation_id.is_(None), ResponseRow.created_at < cutoff
    )
    resp_ids = list((await session.execute(old_resps)).scalars())
    if not resp_ids:
        return purged
    await session.execute(
        update(ConversationRow)
        .where(ConversationRow.last_response_id.in_(resp_ids))
        .values(last_response_id=None)
    )
    items = await session.execute(delete(ItemRow).where(ItemRow.response_id.in_(resp_ids)))
    resps = await session.execute(delete(ResponseRow).where(ResponseRow.id.in_(resp_ids)))
    return purged + Purged(0, rowcount(resps), rowcount(items))


async def purge_expired(session: AsyncSession, now: datetime, default_days: int | None) -> Purged:
    """Conversations idle longer than their tenant's retention, and standalone responses
    older: ``tenants.conversation_retention_days`` (0 or NULL: ``default_days``; None: kept)."""
    rows = (await session.execute(select(Tenant.id, Tenant.conversation_retention_days))).all()
    purged = Purged()
    for tenant_id, days in rows:
        keep = days or default_days  # 0 or NULL: the default
        if keep:
            purged += await _purge_tenant(session, tenant_id, now - timedelta(days=keep))
    return purged
