"""Chat messages as a request carries them (the ``messages`` of ``POST /v1/chat/completions``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gateway.chat.tools.models import ToolCallIn

__all__ = ["ChatMessage", "TextPart"]


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message. ``content`` may be null only on an assistant message with ``tool_calls``; a
    ``tool`` message answers one of those calls (its ``tool_call_id``)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    @property
    def texts(self) -> list[str]:
        """Every text of the message that reaches the prompt: content, called names, arguments
        (the prompt bounds count them all)."""
        calls = self.tool_calls or ()
        return [self.text, *(t for c in calls for t in (c.function.name, c.function.arguments))]

    @property
    def is_system(self) -> bool:
        return self.role in ("system", "developer")
