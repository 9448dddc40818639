"""The tenant prefix: a tenant's system prompt (and its tools) rendered as its own token segment.

    rendered prefix  = template([tenant system, *tool turns], **tool kwargs)   (no gen. prompt)

The tool parts are the tenant's tool definitions as the model's template takes them
(gateway/chat/tools/tenant.py builds them with gateway/chat/tools/render.py): ``tools=`` for a
template that renders tools itself, else one system turn with the family's instructions. So a
tenant's tools are inside the pinned prefix and cost no prefill.

Tokenized on its own, so a BPE merge never crosses into the conversation after it
(gateway/chat/prompt.py): every request of a tenant starts with exactly ``prefix.ids``, the
tokens the pin manager (gateway/pins.py) pins and the admin API counts against the context.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.text.chat_encoding import ControlMarks


class ChatTokenizer(Protocol):
    control_marks: ControlMarks

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = ...,
        *,
        marked: bool = ...,
        **extra: Any,
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
    # The template's messages and keyword arguments of the prefix (the conversation follows).
    turns: tuple[Mapping[str, Any], ...] = ()
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


def build_prefix(
    tokenizer: ChatTokenizer,
    system_prompt: str | None,
    tool_turns: Sequence[Mapping[str, Any]] = (),
    template_kwargs: Mapping[str, Any] | None = None,
) -> TenantPrefix:
    if not system_prompt:
        return TenantPrefix(None, "", ())
    turns = ({"role": "system", "content": system_prompt}, *tool_turns)
    kwargs = dict(template_kwargs or {})
    plain = tokenizer.apply_chat_template(turns, add_generation_prompt=False, **kwargs)
    marked = tokenizer.apply_chat_template(
        turns, add_generation_prompt=False, marked=True, **kwargs
    )
    ids = tuple(tokenizer.encode(plain))
    return TenantPrefix(system_prompt, marked, ids, turns, kwargs)
