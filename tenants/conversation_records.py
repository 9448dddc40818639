"""Typed values of the conversation store (tenants/conversations.py): scopes in, records out.

A ``Scope`` says whose rows a call may touch: ``OwnerScope`` (one owner of one tenant: the API
and the widget) or ``TenantScope`` (every owner of one tenant: operators, retention). There is
no scope without a tenant.
"""

from __future__ import annotations

import array
import secrets
import sys
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from tenants.conversation_models import ConversationRow, ItemRow, ResponseRow
from tenants.errors import TenantStoreError

Direction = Literal["input", "output"]
Order = Literal["asc", "desc"]


@dataclass(frozen=True)
class OwnerScope:
    """One owner's rows: ``owner`` is the end-user identity (gateway/chat/cache_scope.py)."""

    tenant_id: str
    owner: str


@dataclass(frozen=True)
class TenantScope:
    """Every owner's rows of one tenant (operators, retention, data-subject deletion)."""

    tenant_id: str


Scope = OwnerScope | TenantScope


class ConversationNotFound(TenantStoreError):
    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} not found", param="conversation_id")


class ResponseNotFound(TenantStoreError):
    def __init__(self, response_id: str) -> None:
        super().__init__(f"response {response_id!r} not found", param="response_id")


class ItemNotFound(TenantStoreError):
    def __init__(self, item_id: str) -> None:
        super().__init__(f"item {item_id!r} not found", param="item_id")


class OwnerGone(TenantStoreError):
    """A write whose tenant or conversation was deleted meanwhile (its row's reference is
    gone: a key still cached by a gateway after its tenant's deletion, say)."""

    def __init__(self) -> None:
        super().__init__("the tenant or conversation of this request no longer exists")


def new_id(prefix: str) -> str:
    """``conv_`` / ``resp_`` / ``msg_`` ... + 48 random hex digits (OpenAI's ids' shape)."""
    return f"{prefix}_{secrets.token_hex(24)}"


def pack_ids(ids: list[int] | tuple[int, ...]) -> bytes:
    """Token ids as little-endian uint32 (the ``tail_ids`` column)."""
    arr = array.array("I", ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def unpack_ids(raw: bytes | None) -> tuple[int, ...]:
    if not raw:
        return ()
    arr = array.array("I")
    arr.frombytes(raw)
    if sys.byteorder != "little":
        arr.byteswap()
    return tuple(arr)


@dataclass(frozen=True)
class NewItem:
    """An item to store: ``data`` is its JSON object (its ``id`` and ``type`` included)."""

    id: str
    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class ItemRecord:
    id: str
    type: str
    data: dict[str, Any]
    conversation_id: str | None
    response_id: str | None
    direction: Direction
    created_at: datetime

    @classmethod
    def of(cls, row: ItemRow) -> ItemRecord:
        direction: Direction = "output" if row.direction == "output" else "input"
        return cls(
            id=row.id,
            type=row.type,
            data=dict(row.data),
            conversation_id=row.conversation_id,
            response_id=row.response_id,
            direction=direction,
            created_at=row.created_at,
        )


@dataclass(frozen=True)
class ConversationRecord:
    id: str
    tenant_id: str
    owner: str
    metadata: dict[str, str]
    created_at: datetime
    updated_at: datetime
    last_response_id: str | None
    turns: int
    input_tokens: int
    output_tokens: int

    @classmethod
    def of(cls, row: ConversationRow) -> ConversationRecord:
        return cls(
            id=row.id,
            tenant_id=row.tenant_id,
            owner=row.owner,
            metadata={str(k): str(v) for k, v in (row.meta or {}).items()},
            created_at=row.created_at,
            updated_at=row.updated_at,
            last_response_id=row.last_response_id,
            turns=row.turns,
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
        )


@dataclass(frozen=True)
class Tail:
    """A stored turn's token ids after the tenant prefix identified by ``prefix_digest``."""

    prefix_digest: str
    ids: tuple[int, ...] = field(repr=False)


@dataclass(frozen=True)
class ResponseRecord:
    id: str
    tenant_id: str
    owner: str
    conversation_id: str | None
    previous_response_id: str | None
    key_id: str | None
    model: str
    status: str
    created_at: datetime
    body: dict[str, Any] = field(repr=False)
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    tail: Tail | None

    @classmethod
    def of(cls, row: ResponseRow) -> ResponseRecord:
        tail = None
        if row.prefix_digest is not None and row.tail_ids:
            tail = Tail(row.prefix_digest, unpack_ids(row.tail_ids))
        return cls(
            id=row.id,
            tenant_id=row.tenant_id,
            owner=row.owner,
            conversation_id=row.conversation_id,
            previous_response_id=row.previous_response_id,
            key_id=row.key_id,
            model=row.model,
            status=row.status,
            created_at=row.created_at,
            body=dict(row.body),
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            cached_tokens=row.cached_tokens,
            tail=tail,
        )


@dataclass(frozen=True)
class NewResponse:
    """A response to store with its input and output items. With ``conversation_id`` the items
    are appended to that conversation (same owner) and its counters and last response move."""

    id: str
    scope: OwnerScope
    model: str
    status: str
    created_at: datetime
    body: dict[str, Any] = field(repr=False)
    inputs: tuple[NewItem, ...]
    outputs: tuple[NewItem, ...]
    conversation_id: str | None = None
    previous_response_id: str | None = None
    key_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    tail: Tail | None = None


@dataclass(frozen=True)
class Page:
    """One page of items (OpenAI's list: ``first_id`` / ``last_id`` / ``has_more``)."""

    items: tuple[ItemRecord, ...]
    has_more: bool


@dataclass(frozen=True)
class ConversationPage:
    conversations: tuple[ConversationRecord, ...]
    has_more: bool


@dataclass(frozen=True)
class Purged:
    """What a deletion removed."""

    conversations: int = 0
    responses: int = 0
    items: int = 0

    def __add__(self, other: Purged) -> Purged:
        return Purged(
            self.conversations + other.conversations,
            self.responses + other.responses,
            self.items + other.items,
        )
