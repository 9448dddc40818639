"""Tokenizer (HF ``tokenizers``), chat template, EOS ids and streaming detokenization.

Two ways to encode: ``encode`` is the tokenizer's own (control tokens matched anywhere in the
text; the tenant's system prompt, tests' parity with transformers); ``apply_chat_template(...,
marked=True)`` + ``encode_marked`` encode a conversation whose control tokens come from the
template alone, the messages as plain text (engine/text/chat_encoding.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.text.chat_encoding import ControlMarks, PlainView
from engine.text.chat_template import TemplateError, render_chat
from engine.text.errors import ModelLoadError, read_json, tokenizer_config, tokenizer_file
from engine.text.text_bound import TextBound, text_bound

if TYPE_CHECKING:
    from tokenizers import Encoding
    from tokenizers import Tokenizer as Backend

# A conversation the template must render the same with control tokens marked or not.
_PROBE = (
    [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
    [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
)

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json stores special tokens as strings or AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


class Tokenizer:
    def __init__(
        self, backend: Backend, tokenizer_config: dict[str, Any], eos_ids: list[int]
    ) -> None:
        self.backend = backend
        self.chat_template: str | None = tokenizer_config.get("chat_template")
        self.special_tokens = {k: _token_text(tokenizer_config.get(k)) for k in _SPECIAL_KEYS}
        self.add_bos = bool(tokenizer_config.get("add_bos_token", False))
        self.eos_token_ids = tuple(dict.fromkeys(eos_ids))  # ordered, unique
        # One nonce per tokenizer, made here: the marks a render writes are the view's marks.
        decoder = backend.get_added_tokens_decoder()
        self.control_marks = ControlMarks({i: tok for i, tok in decoder.items() if tok.special})
        self._lock = threading.Lock()
        self._plain: tuple[PlainView, TextBound | None] | None = None

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        model_dir = Path(model_dir)
        path = tokenizer_file(model_dir)
        try:
            backend = Backend.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception subclass
            raise ModelLoadError(f"{path}: cannot load tokenizer: {exc}") from exc
        tok_cfg = tokenizer_config(model_dir)
        eos: list[int] = []
        for name in ("generation_config.json", "config.json"):
            if (model_dir / name).is_file():
                eos += _as_list(read_json(model_dir / name).get("eos_token_id"))
        eos_text = _token_text(tok_cfg.get("eos_token"))
        eos_id = backend.token_to_id(eos_text) if eos_text is not None else None
        if eos_id is not None:
            eos.append(eos_id)
        return cls(backend, tok_cfg, eos)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` (``encoding``'s, as a list)."""
        ids = self.encoding(text, add_special_tokens).ids
        bos = self.special_tokens["bos_token"]
        if add_special_tokens and self.add_bos and bos is not None:
            bos_id = self.backend.token_to_id(bos)
            if bos_id is not None and (not ids or ids[0] != bos_id):
                ids = [bos_id, *ids]
        return ids

    def encoding(self, text: str, add_special_tokens: bool = False) -> Encoding:
        """The tokenizer's encoding of ``text`` before its ids are Python ints: its ``len`` is
        the token count, ``ids`` makes the list. Through ``encode_batch_fast``, which releases
        the GIL while it works (the backend's ``encode`` holds it: a 200k-character system
        prompt encoded on a worker thread stalled the event loop for ~0.5 s); the ids are
        ``encode``'s. Making the list (~30 ns a token) holds the GIL: a low-priority thread
        should leave that to the event loop (gateway/prompts/tenant_prefix.py)."""
        return self.backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        marked: bool = False,
        **extra: Any,
    ) -> str:
        """The rendered conversation. ``marked``: the template's control tokens as marks, for
        ``encode_marked`` (message text is checked for forged marks, rendered as sent)."""
        if not self.chat_template:
            raise ModelLoadError("tokenizer_config.json: no chat_template")
        if not marked:
            return self._render(
                self.chat_template, self.special_tokens, messages, add_generation_prompt, extra
            )
        marks = self.control_marks
        for m in messages:
            if isinstance(m.get("content"), str):
                marks.check_text(m["content"])
        template, specials = self._marked_template
        return self._render(template, specials, messages, add_generation_prompt, extra)

    def _render(
        self,
        template: str,
        specials: dict[str, str | None],
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool,
        extra: dict[str, Any],
    ) -> str:
        return render_chat(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=specials,
            **extra,
        )

    @cached_property
    def _marked_template(self) -> tuple[str, dict[str, str | None]]:
        """The template and special-token names with control tokens as marks, checked to encode
        a probe conversation exactly as the plain template does (a template that built a control
        token from pieces would hide it from the marks: its structure would become text)."""
        assert self.chat_template is not None
        marks = self.control_marks
        template = marks.mark(self.chat_template)
        specials = {k: v if v is None else marks.mark(v) for k, v in self.special_tokens.items()}
        view = self._plain_view()[0]
        for probe in _PROBE:
            try:
                plain = self._render(self.chat_template, self.special_tokens, list(probe), True, {})
            except TemplateError:
                continue  # this template refuses the probe (a system turn, say); try the next
            marked = self._render(template, specials, list(probe), True, {})
            if view.encode(marked) != self.encode(plain):
                raise TemplateError(
                    "chat template builds control tokens from pieces; message text and the "
                    "template's structure cannot be told apart"
                )
        return template, specials

    def encode_marked(self, text: str, limit: int | None = None) -> list[int]:
        """Ids of text from ``apply_chat_template(..., marked=True)``: marks -> control tokens,
        all other text plain (control-token strings in messages are not matched). Releases the
        GIL while it encodes. More than ``limit`` tokens raises ``TokenLimitExceeded``."""
        return self._plain_view()[0].encode(text, limit)

    @property
    def text_bound(self) -> TextBound | None:
        """How many characters of message text one token can cover at most
        (engine/text/text_bound.py); None when this tokenizer can drop or fuse text."""
        return self._plain_view()[1]

    def prepare_chat_encoding(self) -> None:
        """Build the plain view and check the marked template now (a copy of the tokenizer:
        ~0.1-0.5 s for a 50k vocabulary), so no request waits for them."""
        self._plain_view()
        if self.chat_template:
            _ = self._marked_template

    def _plain_view(self) -> tuple[PlainView, TextBound | None]:
        with self._lock:  # built once, by whichever thread asks first
            if self._plain is None:
                spec = json.loads(self.backend.to_str())
                bound = text_bound(spec, self.backend.get_vocab(with_added_tokens=True))
                self._plain = (PlainView(spec, self.control_marks), bound)
            return self._plain


class IncrementalDetokenizer:
    """Streaming text for a growing token list; never emits a partial UTF-8 character.

    Text is emitted once the decoded suffix no longer ends in U+FFFD (a byte sequence cut in the
    middle); ``prefix_offset`` keeps a little left context so tokenizers that depend on it
    (leading spaces) decode the same as the whole string.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, token_ids: list[int] | int) -> str:
        """Add tokens; returns the newly completed text (possibly empty)."""
        self.ids.extend([token_ids] if isinstance(token_ids, int) else token_ids)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], self.skip)
        full = decode(self.ids[self.prefix_offset :], self.skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return full[len(prefix) :]

    def flush(self) -> str:
        """Text still held back at the end of the stream (incomplete bytes dropped)."""
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], self.skip)
        full = decode(self.ids[self.prefix_offset :], self.skip).rstrip("\ufffd")
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""
