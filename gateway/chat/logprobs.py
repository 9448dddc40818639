"""Logprobs in OpenAI's shape: ``{"content": [{token, logprob, bytes, top_logprobs}]}``.

A token's ``bytes`` are its exact UTF-8 bytes, which for byte-level BPE vocabularies (GPT-2 /
Qwen / Llama 3) may be part of a character: the vocabulary's printable stand-ins are mapped back
to bytes. Other vocabularies (SentencePiece) decode the token on its own (``<0xNN>`` byte tokens
give their byte, ``▁`` a space). ``token`` is the bytes as text, or ``bytes:\\xNN...`` when they
are not valid UTF-8 on their own (OpenAI's convention).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any

from engine.outputs import TokenLogprob
from engine.text.tokenizer import Tokenizer

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def _token_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    piece = tokenizer.backend.id_to_token(token_id)
    if piece is None:
        return b""
    table = _byte_level_decoder()
    if all(ch in table for ch in piece):
        return bytes(table[ch] for ch in piece)
    byte = _BYTE_TOKEN.fullmatch(piece)
    if byte:
        return bytes([int(byte.group(1), 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


def _token_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class LogprobFormatter:
    """Token id -> (text, bytes), cached per gateway (the vocabulary does not change)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            raw = _token_bytes(self._tokenizer, token_id)
            hit = self._cache[token_id] = (_token_text(raw), list(raw))
        return hit

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = self._token(token_id)
        return {"token": text, "logprob": logprob, "bytes": raw}

    def content(self, entries: Iterable[TokenLogprob]) -> list[dict[str, Any]]:
        out = []
        for e in entries:
            item = self._entry(e.token_id, e.logprob)
            item["top_logprobs"] = [self._entry(t, lp) for t, lp in e.top]
            out.append(item)
        return out

    def body(self, entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
        """A choice's ``logprobs`` member (None when the request did not ask)."""
        if entries is None:
            return None
        return {"content": self.content(entries), "refusal": None}
