"""Tokenizer (HF ``tokenizers``), chat template, EOS ids and streaming detokenization."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.model.chat_template import render_chat
from engine.model.config import ModelLoadError, read_json

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
    def __init__(self, backend: Any, tokenizer_config: dict[str, Any], eos_ids: list[int]):
        self.backend = backend
        self.chat_template: str | None = tokenizer_config.get("chat_template")
        self.special_tokens = {k: _token_text(tokenizer_config.get(k)) for k in _SPECIAL_KEYS}
        self.add_bos = bool(tokenizer_config.get("add_bos_token", False))
        self.eos_token_ids = tuple(dict.fromkeys(eos_ids))  # ordered, unique

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{path}: file not found")
        try:
            backend = Backend.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception subclass
            raise ModelLoadError(f"{path}: cannot load tokenizer: {exc}") from exc
        tok_cfg_path = model_dir / "tokenizer_config.json"
        tok_cfg = read_json(tok_cfg_path) if tok_cfg_path.is_file() else {}
        template_file = model_dir / "chat_template.jinja"
        if "chat_template" not in tok_cfg and template_file.is_file():
            tok_cfg["chat_template"] = template_file.read_text(encoding="utf-8")
        eos: list[int] = []
        for name in ("generation_config.json", "config.json"):
            if (model_dir / name).is_file():
                eos += _as_list(read_json(model_dir / name).get("eos_token_id"))
        eos_text = _token_text(tok_cfg.get("eos_token"))
        if eos_text is not None and backend.token_to_id(eos_text) is not None:
            eos.append(backend.token_to_id(eos_text))
        return cls(backend, tok_cfg, eos)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        bos = self.special_tokens["bos_token"]
        if add_special_tokens and self.add_bos and bos is not None:
            bos_id = self.backend.token_to_id(bos)
            if bos_id is not None and (not ids or ids[0] != bos_id):
                ids = [bos_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        if not self.chat_template:
            raise ModelLoadError("tokenizer_config.json: no chat_template")
        return render_chat(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens,
            **extra,
        )


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
