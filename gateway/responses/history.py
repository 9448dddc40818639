"""What a turn continues: the items of ``previous_response_id``'s chain or of ``conversation``,
and the stored tail of its last response (gateway/responses/tail.py), read under the caller's
owner scope (an id of another owner or tenant is a 404, as one that never existed); the stored
items its ``item_reference`` inputs name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import ApiError
from gateway.responses.request import ResponsesRequest
from tenants.conversation_records import (
    ConversationNotFound,
    ItemNotFound,
    ItemRecord,
    NewItem,
    OwnerScope,
    ResponseNotFound,
    Tail,
)
from tenants.conversation_store import ConversationStore


@dataclass(frozen=True)
class History:
    items: tuple[ItemRecord, ...] = ()
    tail: Tail | None = None  # the last response's, when the items end with its output

    @property
    def data(self) -> list[dict[str, Any]]:
        return [i.data for i in self.items]


def not_found(what: str, object_id: str, param: str) -> ApiError:
    return ApiError(
        404, f"{what} with id '{object_id[:64]}' not found.", param=param, code="not_found"
    )


async def _previous(store: ConversationStore, scope: OwnerScope, response_id: str) -> History:
    try:
        last = await store.get_response(scope, response_id)
        items = await store.response_history(scope, response_id)
    except ResponseNotFound:
        raise not_found("Previous response", response_id, "previous_response_id") from None
    return History(items, last.tail)


async def _conversation(store: ConversationStore, scope: OwnerScope, conv_id: str) -> History:
    try:
        conv = await store.get_conversation(scope, conv_id)
        items = await store.conversation_history(scope, conv_id)
    except ConversationNotFound:
        raise not_found("Conversation", conv_id, "conversation") from None
    if conv.last_response_id is None:
        return History(items)
    try:
        last = await store.get_response(scope, conv.last_response_id)
    except ResponseNotFound:
        return History(items)
    outputs = [o.get("id") for o in last.body.get("output", [])]
    ends_with_it = bool(outputs) and [i.id for i in items[-len(outputs) :]] == outputs
    return History(items, last.tail if ends_with_it else None)


async def load_history(
    store: ConversationStore, scope: OwnerScope, req: ResponsesRequest
) -> History:
    if req.previous_response_id is not None:
        return await _previous(store, scope, req.previous_response_id)
    conv_id = req.conversation_id
    if conv_id is not None:
        return await _conversation(store, scope, conv_id)
    return History()


async def resolve_references(
    store: ConversationStore, scope: OwnerScope, items: list[NewItem], param: str = "input"
) -> list[NewItem]:
    """``item_reference`` inputs as the stored items they name (the owner's own, from any of
    its responses or conversations; another owner's id is a 404, as one that never existed).
    The item is taken as it was stored: its id, type and content."""
    out: list[NewItem] = []
    for index, item in enumerate(items):
        if item.type != "item_reference":
            out.append(item)
            continue
        try:
            found = await store.find_item(scope, item.id)
        except ItemNotFound:
            raise not_found("Item", item.id, f"{param}[{index}].id") from None
        out.append(NewItem(found.id, found.type, dict(found.data)))
    return out
