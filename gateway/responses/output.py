"""A turn's answer as Responses output items, and the stored record of the turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.chat.generation import GenerationStats
from gateway.responses.items import call_item, message_item
from gateway.responses.objects import Usage
from tenants.conversation_records import NewItem


@dataclass(frozen=True)
class Answer:
    """What the model answered: its text (None: calls only), its calls (chat's ``tool_calls``
    entries), and the chat finish reason."""

    text: str | None
    calls: tuple[dict[str, Any], ...]
    finish_reason: str

    @property
    def status(self) -> str:
        return "incomplete" if self.finish_reason == "length" else "completed"

    @property
    def incomplete_reason(self) -> str | None:
        return "max_output_tokens" if self.finish_reason == "length" else None


def output_items(answer: Answer, message_id: str | None = None) -> list[NewItem]:
    """A message (when there is text, or nothing else), then one item per call."""
    items: list[NewItem] = []
    if answer.text or not answer.calls:
        items.append(message_item("assistant", answer.text or "", message_id))
    for call in answer.calls:
        fn = call["function"]
        items.append(call_item(str(call["id"]), str(fn["name"]), str(fn["arguments"])))
    if answer.status == "incomplete" and items and items[0].type == "message":
        items[0].data["status"] = "incomplete"
    return items


def usage_of(stats: GenerationStats) -> Usage:
    return Usage(stats.prompt_tokens, stats.completion_tokens, stats.cached_tokens)


def item_bodies(items: Sequence[NewItem]) -> list[dict[str, Any]]:
    return [dict(i.data) for i in items]
