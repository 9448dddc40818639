"""How many characters of text one token can stand for: lets a prompt be refused as too long
before it is tokenized, without ever refusing one that would fit.

A token covers at most as many characters of the normalized text as its vocabulary string has:
byte-level BPE spells each byte as one character (and a character is at least one byte),
SentencePiece spells each character as one (``▁`` for a space; a byte piece ``<0x0A>`` covers
one byte), an added token covers its own text. So a text of C characters needs at least C / L
tokens, L the longest vocabulary string, as long as no stage drops or fuses characters::

    normalizer      none, Prepend, Lowercase, NFD / NFKD, ByteLevel: never shorter;
                    Replace of a string by one as long or longer: never shorter;
                    NFC / NFKC: at most COMPOSED code points become one    -> L x COMPOSED
    pre-tokenizer   ByteLevel, Metaspace, Digits, UnicodeScripts, Split / Punctuation that keep
                    the matches: every character stays
    model           BPE with byte fallback, or each unknown character its own unknown token, or
                    byte-level where a missing byte token drops its character: an ASCII
                    character whose byte has no token is dropped and not counted (SmolLM2 lacks
                    a few control characters); the continuation bytes must all have tokens
    added tokens    none strips the whitespace beside it

Anything else (whitespace dropped before BERT-style models, stripped accents, a run of unknown
characters fused into one token, an added token swallowing the spaces after it) can shrink the
text without bound: then there is no bound (``None``).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, NamedTuple

COMPOSED = 4  # the longest canonical decomposition of any code point (U+1F82 and others)

_KEEP_NORMALIZERS = ("Prepend", "Lowercase", "NFD", "NFKD", "ByteLevel")
_KEEP_PRE_TOKENIZERS = ("ByteLevel", "Metaspace", "Digits", "UnicodeScripts")
_SPLITTERS = ("Split", "Punctuation")


class TextBound(NamedTuple):
    """A text needs at least ``count(text) / chars_per_token`` tokens."""

    chars_per_token: int
    dropped: str = ""  # characters the tokenizer drops without a token: not counted

    def count(self, text: str) -> int:
        """Characters of ``text`` that count. The gateway counts every message on its event
        loop: ``str.find`` of one character is a ``memchr`` (0.02 ms per MiB), ``str.count``
        a full pass (~1 ms per MiB), so only a dropped character that occurs is counted (one
        pass each over a 1 MiB widget message took 2 ms, 7-15 ms on a busy host, per request)."""
        return len(text) - sum(text.count(c) for c in self.dropped if c in text)


def text_bound(spec: dict[str, Any], vocab: dict[str, int]) -> TextBound | None:
    """The bound of the tokenizer.json ``spec`` (``vocab`` with added tokens), or None."""
    slack = _normalizer_slack(spec.get("normalizer"))
    if slack is None or not _keeps_text(spec.get("pre_tokenizer")):
        return None
    dropped = _dropped_chars(spec, vocab)
    if dropped is None:
        return None
    if any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens") or []):
        return None
    longest = max((len(token) for token in vocab), default=1)
    return TextBound(max(1, longest) * slack, dropped)


def _normalizer_slack(spec: dict[str, Any] | None) -> int | None:
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind in _KEEP_NORMALIZERS:
        return 1
    if kind in ("NFC", "NFKC"):
        return COMPOSED
    if kind == "Replace":
        pattern, content = spec.get("pattern") or {}, str(spec.get("content", ""))
        if "String" not in pattern or not content:
            return None  # a regex can match any length
        return max(1, math.ceil(len(str(pattern["String"])) / len(content)))
    if kind == "Sequence":
        total = 1
        for part in spec.get("normalizers") or []:
            slack = _normalizer_slack(part)
            if slack is None:
                return None
            total *= slack
        return total
    return None


def _keeps_text(spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_keeps_text(part) for part in spec.get("pretokenizers") or [])
    if kind in _SPLITTERS:
        return str(spec.get("behavior", "")).lower() != "removed"
    return kind in _KEEP_PRE_TOKENIZERS


def _dropped_chars(spec: dict[str, Any], vocab: dict[str, int]) -> str | None:
    """Characters the model drops (no token, no unknown token); None if it may drop or fuse
    more than single characters it can name."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None
    if model.get("byte_fallback") and all(f"<0x{b:02X}>" in vocab for b in range(256)):
        return ""
    if model.get("unk_token") is not None and not model.get("fuse_unk"):
        return ""  # every unknown character is a token of its own
    if not _byte_level(spec.get("pre_tokenizer")):
        return None
    missing = [b for b, ch in byte_alphabet().items() if ch not in vocab]
    if any(0x80 <= b < 0xC0 for b in missing):
        return None  # a character made of missing bytes only could vanish
    # A missing ASCII byte drops its character; a character of several bytes keeps the token of
    # its continuation bytes (0x80-0xBF, all present). Bytes never in UTF-8 (0xC0, 0xC1,
    # 0xF5-0xFF) and lead bytes only drop part of a character.
    return "".join(chr(b) for b in missing if b < 0x80)


def _byte_level(spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return False
    if spec.get("type") == "Sequence":
        return any(_byte_level(part) for part in spec.get("pretokenizers") or [])
    return spec.get("type") == "ByteLevel"


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the alphabet of byte-level vocabularies)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out
