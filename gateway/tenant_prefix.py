"""The tenant prefix: a tenant's system prompt rendered as its own token segment.

    rendered prefix  = template([tenant system])                   (no generation prompt)

Tokenized on its own, so a BPE merge never crosses into the conversation after it
(gateway/chat/prompt.py): every request of a tenant starts with exactly ``prefix.ids``, the
tokens the pin manager (gateway/pins.py) pins and the admin API counts against the context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class ChatTokenizer(Protocol):
    def apply_chat_template(
        self,
        messages: Sequence[dict[str, str]],
        *,
        add_generation_prompt: bool = ...,
        marked: bool = ...,
    ) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_marked(self, text: str, limit: int | None = ...) -> list[int]: ...


class TemplateMismatch(RuntimeError):
    """The chat template does not render the tenant prefix as a prefix of the conversation."""


@dataclass(frozen=True)
class TenantPrefix:
    """The tenant's system prompt: its marked rendering (where the conversation is cut) and its
    token ids (the tokenizer's own encoding of the plain rendering); empty when it has none."""

    system_prompt: str | None
    rendered: str
    ids: tuple[int, ...]


def build_prefix(tokenizer: ChatTokenizer, system_prompt: str | None) -> TenantPrefix:
    if not system_prompt:
        return TenantPrefix(None, "", ())
    turn = [{"role": "system", "content": system_prompt}]
    plain = tokenizer.apply_chat_template(turn, add_generation_prompt=False)
    marked = tokenizer.apply_chat_template(turn, add_generation_prompt=False, marked=True)
    return TenantPrefix(system_prompt, marked, tuple(tokenizer.encode(plain)))
