"""Conversations and their items, scoped by (tenant, owner), and the scoped queries the
response functions (tenants/stored_responses.py) share. Each function takes the caller's
session; ``ConversationStore`` (tenants/conversation_store.py) runs them as units of work.
An id that exists under another owner or tenant raises the same ``*NotFound`` as one that
never existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.conversation_models import ConversationRow, ItemRow, ResponseRow
from tenants.conversation_records import (
    ConversationNotFound,
    ConversationPage,
    ConversationRecord,
    Direction,
    ItemNotFound,
    ItemRecord,
    NewItem,
    Order,
    OwnerScope,
    Page,
    Purged,
    ResponseNotFound,
    Scope,
    new_id,
)
from tenants.models import utcnow


def _owned(scope: Scope, tenant_col: Any, owner_col: Any) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = [tenant_col == scope.tenant_id]
    if isinstance(scope, OwnerScope):
        where.append(owner_col == scope.owner)
    return where


def conv_where(scope: Scope) -> list[ColumnElement[bool]]:
    return _owned(scope, ConversationRow.tenant_id, ConversationRow.owner)


def resp_where(scope: Scope) -> list[ColumnElement[bool]]:
    return _owned(scope, ResponseRow.tenant_id, ResponseRow.owner)


async def conversation_row(session: AsyncSession, scope: Scope, conv_id: str) -> ConversationRow:
    stmt = select(ConversationRow).where(ConversationRow.id == conv_id, *conv_where(scope))
    row = (await session.execute(stmt)).scalar_one_or_none()
    if row is None:
        raise ConversationNotFound(conv_id)
    return row


async def response_row(session: AsyncSession, scope: Scope, response_id: str) -> ResponseRow:
    stmt = select(ResponseRow).where(ResponseRow.id == response_id, *resp_where(scope))
    row = (await session.execute(stmt)).scalar_one_or_none()
    if row is None:
        raise ResponseNotFound(response_id)
    return row


def item_rows(
    scope: OwnerScope,
    items: Sequence[NewItem],
    *,
    conversation_id: str | None,
    response_id: str | None,
    direction: Direction,
    at: datetime,
) -> list[ItemRow]:
    return [
        ItemRow(
            id=item.id,
            tenant_id=scope.tenant_id,
            owner=scope.owner,
            conversation_id=conversation_id,
            response_id=response_id,
            direction=direction,
            type=item.type,
            data=item.data,
            created_at=at,
        )
        for item in items
    ]


async def add_items(session: AsyncSession, rows: list[ItemRow]) -> tuple[ItemRecord, ...]:
    session.add_all(rows)
    await session.flush()  # assigns pk: the items' order
    return tuple(ItemRecord.of(r) for r in rows)


async def delete_conversations(session: AsyncSession, ids: Sequence[str]) -> Purged:
    if not ids:
        return Purged()
    resp_ids = select(ResponseRow.id).where(ResponseRow.conversation_id.in_(ids))
    items = await session.execute(
        delete(ItemRow).where(
            or_(ItemRow.conversation_id.in_(ids), ItemRow.response_id.in_(resp_ids))
        )
    )
    resps = await session.execute(delete(ResponseRow).where(ResponseRow.conversation_id.in_(ids)))
    convs = await session.execute(delete(ConversationRow).where(ConversationRow.id.in_(ids)))
    return Purged(rowcount(convs), rowcount(resps), rowcount(items))


def rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


# -- conversations ----------------------------------------------------------------------------
async def create_conversation(
    session: AsyncSession,
    scope: OwnerScope,
    metadata: dict[str, str],
    items: Sequence[NewItem] = (),
) -> ConversationRecord:
    at = utcnow()
    row = ConversationRow(
        id=new_id("conv"),
        tenant_id=scope.tenant_id,
        owner=scope.owner,
        meta=dict(metadata),
        created_at=at,
        updated_at=at,
        turns=0,
        input_tokens=0,
        output_tokens=0,
    )
    session.add(row)
    await session.flush()
    rows = item_rows(
        scope, items, conversation_id=row.id, response_id=None, direction="input", at=at
    )
    await add_items(session, rows)
    return ConversationRecord.of(row)


async def get_conversation(session: AsyncSession, scope: Scope, conv_id: str) -> ConversationRecord:
    return ConversationRecord.of(await conversation_row(session, scope, conv_id))


async def update_conversation(
    session: AsyncSession, scope: Scope, conv_id: str, metadata: dict[str, str]
) -> ConversationRecord:
    row = await conversation_row(session, scope, conv_id)
    row.meta = dict(metadata)
    row.updated_at = utcnow()
    await session.flush()
    return ConversationRecord.of(row)


async def delete_conversation(session: AsyncSession, scope: Scope, conv_id: str) -> Purged:
    """The conversation, its items and the responses made in it."""
    row = await conversation_row(session, scope, conv_id)
    return await delete_conversations(session, [row.id])


async def list_conversations(
    session: AsyncSession,
    scope: Scope,
    *,
    limit: int = 20,
    after: str | None = None,
    order: Order = "desc",
) -> ConversationPage:
    """By creation time (``desc``: newest first); ``after``: a conversation id of the scope."""
    stmt = select(ConversationRow).where(*conv_where(scope))
    at, key = ConversationRow.created_at, ConversationRow.id
    if after is not None:
        cur = await conversation_row(session, scope, after)
        if order == "desc":
            stmt = stmt.where(or_(at < cur.created_at, and_(at == cur.created_at, key < cur.id)))
        else:
            stmt = stmt.where(or_(at > cur.created_at, and_(at == cur.created_at, key > cur.id)))
    ordering = (at.desc(), key.desc()) if order == "desc" else (at.asc(), key.asc())
    rows = (await session.execute(stmt.order_by(*ordering).limit(limit + 1))).scalars().all()
    page = tuple(ConversationRecord.of(r) for r in rows[:limit])
    return ConversationPage(page, has_more=len(rows) > limit)


# -- items ------------------------------------------------------------------------------------
async def append_items(
    session: AsyncSession, scope: OwnerScope, conv_id: str, items: Sequence[NewItem]
) -> tuple[ItemRecord, ...]:
    row = await conversation_row(session, scope, conv_id)
    at = utcnow()
    row.updated_at = at
    rows = item_rows(
        scope, items, conversation_id=row.id, response_id=None, direction="input", at=at
    )
    return await add_items(session, rows)


async def item_page(
    session: AsyncSession,
    where: list[ColumnElement[bool]],
    *,
    limit: int,
    after: str | None,
    order: Order,
) -> Page:
    stmt = select(ItemRow).where(*where)
    if after is not None:
        pk = (await session.execute(select(ItemRow.pk).where(ItemRow.id == after, *where))).scalar()
        if pk is None:
            raise ItemNotFound(after)
        stmt = stmt.where(ItemRow.pk < pk if order == "desc" else ItemRow.pk > pk)
    ordering = ItemRow.pk.desc() if order == "desc" else ItemRow.pk.asc()
    rows = (await session.execute(stmt.order_by(ordering).limit(limit + 1))).scalars().all()
    return Page(tuple(ItemRecord.of(r) for r in rows[:limit]), has_more=len(rows) > limit)


async def list_items(
    session: AsyncSession,
    scope: Scope,
    conv_id: str,
    *,
    limit: int = 20,
    after: str | None = None,
    order: Order = "desc",
) -> Page:
    await conversation_row(session, scope, conv_id)
    return await item_page(
        session, [ItemRow.conversation_id == conv_id], limit=limit, after=after, order=order
    )


async def conversation_history(
    session: AsyncSession, scope: Scope, conv_id: str
) -> tuple[ItemRecord, ...]:
    await conversation_row(session, scope, conv_id)
    stmt = select(ItemRow).where(ItemRow.conversation_id == conv_id).order_by(ItemRow.pk)
    return tuple(ItemRecord.of(r) for r in (await session.execute(stmt)).scalars())


async def _item_row(session: AsyncSession, scope: Scope, conv_id: str, item_id: str) -> ItemRow:
    await conversation_row(session, scope, conv_id)
    stmt = (
        select(ItemRow)
        .where(ItemRow.conversation_id == conv_id, ItemRow.id == item_id)
        .order_by(ItemRow.pk.desc())
        .limit(1)
    )
    row = (await session.execute(stmt)).scalar_one_or_none()
    if row is None:
        raise ItemNotFound(item_id)
    return row


async def get_item(session: AsyncSession, scope: Scope, conv_id: str, item_id: str) -> ItemRecord:
    return ItemRecord.of(await _item_row(session, scope, conv_id, item_id))


async def find_item(session: AsyncSession, scope: Scope, item_id: str) -> ItemRecord:
    """The owner's latest stored item with this id, in any conversation or response (what an
    ``item_reference`` names); another owner's is not found."""
    stmt = (
        select(ItemRow)
        .where(*_owned(scope, ItemRow.tenant_id, ItemRow.owner), ItemRow.id == item_id)
        .order_by(ItemRow.pk.desc())
        .limit(1)
    )
    row = (await session.execute(stmt)).scalar_one_or_none()
    if row is None:
        raise ItemNotFound(item_id)
    return ItemRecord.of(row)


async def delete_item(session: AsyncSession, scope: Scope, conv_id: str, item_id: str) -> None:
    row = await _item_row(session, scope, conv_id, item_id)
    await session.execute(
        delete(ItemRow).where(ItemRow.conversation_id == conv_id, ItemRow.id == row.id)
    )
    # The conversation's token prefix no longer matches its items: the next turn renders them.
    await session.execute(
        update(ConversationRow)
        .where(ConversationRow.id == conv_id)
        .values(last_response_id=None, updated_at=utcnow())
    )


async def count_conversations(session: AsyncSession, scope: Scope) -> int:
    stmt = select(func.count()).select_from(ConversationRow).where(*conv_where(scope))
    return int((await session.execute(stmt)).scalar_one())
