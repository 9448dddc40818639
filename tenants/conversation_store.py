"""Stored conversations and responses, scoped by (tenant, owner): the entry point to the rows of
``conversations``, ``responses`` and ``conversation_items`` (tenants/conversation_models.py).

What callers may use (values in tenants/conversation_records.py):

    scope = OwnerScope(tenant_id, owner)   the API and the widget: one owner's rows only;
                                           owner = "user:<widget session end_user_id>",
                                           "addr:<visitor>" (widget key, no session) or
                                           "key:<key id>" (server key); from a request:
                                           gateway/responses/owner.py ``owner_scope``
    scope = TenantScope(tenant_id)         operators: every owner of the tenant

    ConversationStore(tenant_store)        each method one unit of work (TenantStore.read/write:
                                           the request path's deadline, outage mapping)
      .create_conversation(scope, metadata, items)   -> ConversationRecord
      .get_conversation(scope, id)                   -> ConversationRecord
      .update_conversation(scope, id, metadata)      -> ConversationRecord
      .delete_conversation(scope, id)                -> Purged
      .list_conversations(scope, limit, after, order)-> ConversationPage (newest first by default)
      .append_items(scope, id, items)                -> tuple[ItemRecord, ...]
      .list_items(scope, id, limit, after, order)    -> Page
      .get_item / .delete_item(scope, id, item_id)
      .find_item(scope, item_id)                     -> the owner's item in any conversation
      .conversation_history(scope, id)               -> every item, oldest first
      .save_response(NewResponse)                    -> ResponseRecord
      .get_response / .delete_response(scope, id)
      .list_input_items(scope, response_id, ...)     -> Page
      .response_history(scope, response_id)          -> the chain's items, oldest first
      .delete_owner(tenant_id, owner)                -> Purged (a data-subject request)
      .purge_expired(now, default_days)              -> Purged (retention)

Every read filters on the scope: an id that exists under another owner or tenant raises the same
``ConversationNotFound`` / ``ResponseNotFound`` / ``ItemNotFound`` as one that never existed.
The session-taking functions of tenants/conversations.py and tenants/stored_responses.py are
the same operations for callers that hold a transaction. Operators' deletions with their audit
row: tenants/conversation_admin.py. Counters an operator reads per conversation: ``turns``,
``input_tokens``, ``output_tokens``; spend: the ledger's records whose ``request_id`` is one of
the conversation's response ids.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.conversation_records import (
    ConversationPage,
    ConversationRecord,
    ItemRecord,
    NewItem,
    NewResponse,
    Order,
    OwnerGone,
    OwnerScope,
    Page,
    Purged,
    ResponseRecord,
    Scope,
)
from tenants.conversations import (
    append_items,
    conversation_history,
    create_conversation,
    delete_conversation,
    delete_item,
    find_item,
    get_conversation,
    get_item,
    list_conversations,
    list_items,
    update_conversation,
)
from tenants.store import TenantStore
from tenants.stored_responses import (
    delete_owner,
    delete_response,
    get_response,
    list_input_items,
    purge_expired,
    response_history,
    save_response,
)

_T = TypeVar("_T")


@dataclass(frozen=True)
class ConversationStore:
    """The operations above, each one unit of work of ``store`` (see the module docstring)."""

    store: TenantStore

    async def _write(self, fn: Callable[[AsyncSession], Awaitable[_T]]) -> _T:
        """One unit of work; a reference to a row deleted meanwhile is ``OwnerGone``, not a
        database error."""
        try:
            return await self.store.write(fn)
        except IntegrityError:
            raise OwnerGone() from None

    async def create_conversation(
        self, scope: OwnerScope, metadata: dict[str, str], items: Sequence[NewItem] = ()
    ) -> ConversationRecord:
        return await self._write(lambda s: create_conversation(s, scope, metadata, items))

    async def get_conversation(self, scope: Scope, conv_id: str) -> ConversationRecord:
        return await self.store.read(lambda s: get_conversation(s, scope, conv_id))

    async def update_conversation(
        self, scope: Scope, conv_id: str, metadata: dict[str, str]
    ) -> ConversationRecord:
        return await self._write(lambda s: update_conversation(s, scope, conv_id, metadata))

    async def delete_conversation(self, scope: Scope, conv_id: str) -> Purged:
        return await self._write(lambda s: delete_conversation(s, scope, conv_id))

    async def list_conversations(
        self, scope: Scope, *, limit: int = 20, after: str | None = None, order: Order = "desc"
    ) -> ConversationPage:
        return await self.store.read(
            lambda s: list_conversations(s, scope, limit=limit, after=after, order=order)
        )

    async def append_items(
        self, scope: OwnerScope, conv_id: str, items: Sequence[NewItem]
    ) -> tuple[ItemRecord, ...]:
        return await self._write(lambda s: append_items(s, scope, conv_id, items))

    async def list_items(
        self,
        scope: Scope,
        conv_id: str,
        *,
        limit: int = 20,
        after: str | None = None,
        order: Order = "desc",
    ) -> Page:
        return await self.store.read(
            lambda s: list_items(s, scope, conv_id, limit=limit, after=after, order=order)
        )

    async def get_item(self, scope: Scope, conv_id: str, item_id: str) -> ItemRecord:
        return await self.store.read(lambda s: get_item(s, scope, conv_id, item_id))

    async def find_item(self, scope: Scope, item_id: str) -> ItemRecord:
        return await self.store.read(lambda s: find_item(s, scope, item_id))

    async def delete_item(self, scope: Scope, conv_id: str, item_id: str) -> None:
        await self._write(lambda s: delete_item(s, scope, conv_id, item_id))

    async def conversation_history(self, scope: Scope, conv_id: str) -> tuple[ItemRecord, ...]:
        return await self.store.read(lambda s: conversation_history(s, scope, conv_id))

    async def save_response(self, new: NewResponse) -> ResponseRecord:
        return await self._write(lambda s: save_response(s, new))

    async def get_response(self, scope: Scope, response_id: str) -> ResponseRecord:
        return await self.store.read(lambda s: get_response(s, scope, response_id))

    async def delete_response(self, scope: Scope, response_id: str) -> None:
        await self._write(lambda s: delete_response(s, scope, response_id))

    async def list_input_items(
        self,
        scope: Scope,
        response_id: str,
        *,
        limit: int = 20,
        after: str | None = None,
        order: Order = "desc",
    ) -> Page:
        return await self.store.read(
            lambda s: list_input_items(s, scope, response_id, limit=limit, after=after, order=order)
        )

    async def response_history(self, scope: Scope, response_id: str) -> tuple[ItemRecord, ...]:
        return await self.store.read(lambda s: response_history(s, scope, response_id))

    async def delete_owner(self, tenant_id: str, owner: str) -> Purged:
        return await self._write(lambda s: delete_owner(s, tenant_id, owner))

    async def purge_expired(self, now: datetime, default_days: int | None) -> Purged:
        return await self._write(lambda s: purge_expired(s, now, default_days))
