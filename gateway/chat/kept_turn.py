"""A widget chat turn kept in the visitor's conversation on the server (the widget's history:
gateway/widget/history.py has the routes and the whole story).

``begin_turn`` runs before admission: a request naming its conversation (``X-Kvgate-Conversation``)
must come with a widget session token of a tenant that keeps history, end with the user's new
message, and name a conversation of that visitor (else 403 / 400 / 404, nothing admitted).
``KeptTurn.save`` stores the last user message and the complete answer as one stored response of
the conversation (its counters move with it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web

from gateway.access.auth import Principal
from gateway.chat.generation import GenerationStats
from gateway.chat.messages import ChatMessage
from gateway.context import STATE
from gateway.errors import ApiError
from tenants.conversation_models import ID_MAX
from tenants.conversation_records import (
    ConversationNotFound,
    NewItem,
    NewResponse,
    OwnerScope,
    new_id,
)
from tenants.conversation_store import ConversationStore
from tenants.models import utcnow
from tenants.transcripts import CHAT_ID_KEY

log = structlog.get_logger("gateway.chat")

HEADER = "X-Kvgate-Conversation"
SOURCE = {"source": "widget"}  # the metadata of the conversations the widget started


def _refused(status: int, message: str, code: str) -> ApiError:
    type_ = "permission_error" if status == 403 else "invalid_request_error"
    return ApiError(status, message, type_=type_, code=code)


def owner_scope(principal: Principal) -> OwnerScope:
    """The visitor's scope; refuses callers that cannot have server-side history."""
    if not principal.is_widget or principal.end_user_id is None:
        raise _refused(
            403,
            "conversation history needs a widget session token (a widget key names no visitor)",
            "session_required",
        )
    rt = principal.runtime
    if not rt.widget.history:
        raise _refused(
            403, "this chat does not keep conversations on the server", "history_disabled"
        )
    if not rt.conversations.store:  # the tenant stores no conversations at all
        raise _refused(
            403,
            "this chat does not keep conversations on the server: the tenant stores none",
            "history_disabled",
        )
    return OwnerScope(principal.runtime.tenant_id, f"user:{principal.end_user_id}")


def checked_id(conv_id: str) -> str:
    """``conv_id`` if it can name a stored conversation; else the 404 of an unknown id (no
    query: PostgreSQL text cannot hold NUL, and no id is longer than the column)."""
    if not 0 < len(conv_id) <= ID_MAX or "\x00" in conv_id:
        raise conversation_not_found(conv_id[:ID_MAX])
    return conv_id


def conversation_not_found(conv_id: str) -> ApiError:
    return ApiError(
        404,
        f"conversation {conv_id!r} not found",
        type_="not_found_error",
        code="conversation_not_found",
    )


@dataclass
class KeptTurn:
    """One widget chat request that keeps its turn: where, and the answer as it streams."""

    store: ConversationStore
    scope: OwnerScope
    conversation_id: str
    user_text: str
    key_id: str
    parts: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.parts.append(text)

    async def save(self, model: str, stats: GenerationStats, chat_id: str) -> None:
        """Store the turn; a failure is logged, never the client's (it has its answer)."""
        try:
            await self.store.save_response(self._response(model, stats, chat_id))
        except Exception as exc:  # the database is away, or the conversation was deleted
            log.warning(
                "widget_turn_not_kept",
                conversation_id=self.conversation_id,
                chat_completion_id=chat_id,
                error=type(exc).__name__,
            )

    def _response(self, model: str, stats: GenerationStats, chat_id: str) -> NewResponse:
        resp_id = new_id("resp")
        user = _message(new_id("msg"), "user", "input_text", self.user_text)
        answer = _message(new_id("msg"), "assistant", "output_text", "".join(self.parts))
        usage = {
            "input_tokens": stats.prompt_tokens,
            "input_tokens_details": {"cached_tokens": stats.cached_tokens},
            "output_tokens": stats.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        }
        body: dict[str, Any] = {
            "id": resp_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": model,
            "output": [answer],
            "usage": usage,
            "conversation": {"id": self.conversation_id},
            "metadata": {CHAT_ID_KEY: chat_id},
        }
        return NewResponse(
            id=resp_id,
            scope=self.scope,
            model=model,
            status="completed",
            created_at=utcnow(),
            body=body,
            inputs=(NewItem(user["id"], "message", user),),
            outputs=(NewItem(answer["id"], "message", answer),),
            conversation_id=self.conversation_id,
            key_id=self.key_id,
            input_tokens=stats.prompt_tokens,
            output_tokens=stats.completion_tokens,
            cached_tokens=stats.cached_tokens,
        )


TURN_KEY = web.RequestKey("widget_turn", KeptTurn)


def _message(item_id: str, role: str, part: str, text: str) -> dict[str, Any]:
    content: dict[str, Any] = {"type": part, "text": text}
    if part == "output_text":
        content["annotations"] = []
    return {
        "id": item_id,
        "type": "message",
        "role": role,
        "status": "completed",
        "content": [content],
    }


async def begin_turn(
    request: web.Request, principal: Principal, messages: list[ChatMessage]
) -> KeptTurn | None:
    """The turn of a chat request naming its conversation (``X-Kvgate-Conversation``), checked
    to be the visitor's own before anything is admitted; None without the header."""
    conv_id = request.headers.get(HEADER)
    if conv_id is None:
        return None
    scope = owner_scope(principal)
    checked_id(conv_id)
    last = messages[-1]
    if last.role != "user":
        raise ApiError(
            400,
            f"a request with {HEADER} must end with the user's new message",
            param="messages",
            code="invalid_value",
        )
    store = ConversationStore(request.app[STATE].store)
    try:
        await store.get_conversation(scope, conv_id)
    except ConversationNotFound:
        raise conversation_not_found(conv_id) from None
    turn = KeptTurn(store, scope, conv_id, last.text, principal.identity.key_id)
    request[TURN_KEY] = turn
    return turn


def turn_of(request: web.Request) -> KeptTurn | None:
    return request.get(TURN_KEY)
