"""The tenant prefix: a tenant's system prompt (and its tools) rendered as its own token segment.

    rendered prefix  = template([tenant system, *tool turns], **tool kwargs)   (no gen. prompt)

The tool parts are the tenant's tool definitions as the model's template takes them
(gateway/chat/tools/tenant.py builds them with gateway/chat/tools/render.py): ``tools=`` for a
template that renders tools itself, else one system turn with the family's instructions. So a
tenant's tools are inside the pinned prefix and cost no prefill.

Tokenized on its own, so a BPE merge never crosses into the conversation after it
(gateway/chat/prompt.py): every request of a tenant starts with exactly ``prefix.ids``, the
tokens the pin manager (gateway/prompts/pins.py) pins and the admin API counts against the context.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.text.chat_encoding import ControlMarks
from tenants.runtime import ToolPolicy


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

    def encoding(self, text: str) -> Encoded: ...

    def encode_marked(self, text: str, limit: int | None = ...) -> list[int]: ...


class Encoded(Protocol):
    """A text's encoding before its ids are Python ints (the HF tokenizer's ``Encoding``)."""

    def __len__(self) -> int: ...

    @property
    def ids(self) -> list[int]: ...


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


class EncodedPrefix:
    """A tenant prefix rendered and encoded, its ids not yet made: ``len`` is its token count.

    Two steps, because of where each may run: rendering and encoding a 200k-character prompt
    takes 0.1-0.5 s, most of it in the tokenizer with the GIL released, so it runs on the
    tokenize pool's low-priority threads (``encode_prefix``); making the ids holds the GIL
    (~30 ns a token, a few ms at the largest prompt), and a nice-19 thread holding the GIL can
    be kept off the CPU with it while the event loop waits (measured: stalls of 100+ ms on a
    busy host), so ``prefix()`` is called on the loop. It drops the encoding (the tokenizer's
    strings and offsets: ~14 MB at 200k characters), keeping the ids."""

    def __init__(
        self,
        system_prompt: str | None,
        rendered: str,
        encoding: Encoded | None,
        turns: tuple[Mapping[str, Any], ...] = (),
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self._parts = (system_prompt, rendered, turns, dict(template_kwargs or {}))
        self._count = len(encoding) if encoding is not None else 0
        self._encoding = encoding
        self._prefix: TenantPrefix | None = None

    def __len__(self) -> int:
        return self._count

    def prefix(self) -> TenantPrefix:
        """The prefix with its ids (made once; on the event loop)."""
        if self._prefix is None:
            ids = tuple(self._encoding.ids) if self._encoding is not None else ()
            system_prompt, rendered, turns, kwargs = self._parts
            self._prefix = TenantPrefix(system_prompt, rendered, ids, turns, kwargs)
            self._encoding = None
        return self._prefix


# A prompt version's encoded prefix from its text and tools (gateway/chat/tools/tenant.py).
VersionEncoder = Callable[[str | None, ToolPolicy], EncodedPrefix]


def encode_prefix(
    tokenizer: ChatTokenizer,
    system_prompt: str | None,
    tool_turns: Sequence[Mapping[str, Any]] = (),
    template_kwargs: Mapping[str, Any] | None = None,
) -> EncodedPrefix:
    if not system_prompt:
        return EncodedPrefix(None, "", None)
    turns = ({"role": "system", "content": system_prompt}, *tool_turns)
    kwargs = dict(template_kwargs or {})
    plain = tokenizer.apply_chat_template(turns, add_generation_prompt=False, **kwargs)
    marked = tokenizer.apply_chat_template(
        turns, add_generation_prompt=False, marked=True, **kwargs
    )
    return EncodedPrefix(system_prompt, marked, tokenizer.encoding(plain), turns, kwargs)


def build_prefix(
    tokenizer: ChatTokenizer,
    system_prompt: str | None,
    tool_turns: Sequence[Mapping[str, Any]] = (),
    template_kwargs: Mapping[str, Any] | None = None,
) -> TenantPrefix:
    return encode_prefix(tokenizer, system_prompt, tool_turns, template_kwargs).prefix()
