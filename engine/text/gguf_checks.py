"""Shape checks of a GGUF file's tokenizer metadata, before the tokenizer is built from it.

The metadata comes from the file as the ``gguf`` reader decodes it (lists, strings, numbers of
whatever types the file declares); ``engine/text/gguf_tokenizer.py`` builds on it only
after ``check_metadata`` (and, for byte-level BPE, ``check_merges``) found the kinds and lengths it
relies on, so a malformed file is one ``ModelLoadError`` naming the key and the entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.text.errors import ModelLoadError

SPECIAL_ID_KEYS = ("bos_token_id", "unknown_token_id", "padding_token_id")
EOS_ID_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")
# Longest SentencePiece piece: spm_merges tries every split of every piece (quadratic per piece).
# SentencePiece's trainer caps pieces at 512 characters (its default is 16).
MAX_SPM_PIECE = 512


def _list_of(meta: Mapping[str, Any], key: str, kinds: Any, n: int | None, where: str) -> None:
    """``tokenizer.ggml.{key}``, when present, is a list of ``kinds`` (``n`` long if given)."""
    value = meta.get(f"tokenizer.ggml.{key}")
    if value is None:
        return
    if not isinstance(value, list):
        raise ModelLoadError(f"{where}: metadata tokenizer.ggml.{key} is not a list")
    if n is not None and len(value) != n:
        raise ModelLoadError(
            f"{where}: metadata tokenizer.ggml.{key} has {len(value)} entries for {n} tokens"
        )
    wrong = (i for i, v in enumerate(value) if isinstance(v, bool) or not isinstance(v, kinds))
    bad = next(wrong, None)
    if bad is not None:
        raise ModelLoadError(
            f"{where}: metadata tokenizer.ggml.{key}[{bad}] = {value[bad]!r:.40} is not "
            f"{getattr(kinds, '__name__', 'a number')}"
        )


def check_metadata(meta: Mapping[str, Any], where: str) -> None:
    """The tokenizer metadata has the shapes the builders rely on, else ``ModelLoadError``:
    tokens a non-empty list of strings (SentencePiece pieces at most ``MAX_SPM_PIECE``
    characters: their merges are derived from every split), token types, scores and merges
    lists of the right kinds and lengths, ids integers, ``pre`` and the template strings."""
    _list_of(meta, "tokens", str, None, where)
    tokens = meta["tokenizer.ggml.tokens"]
    if not tokens:
        raise ModelLoadError(f"{where}: metadata tokenizer.ggml.tokens is empty")
    _list_of(meta, "token_type", int, len(tokens), where)
    _list_of(meta, "scores", int | float, len(tokens), where)
    _list_of(meta, "merges", str, None, where)
    for key in ("pre", "model"):
        if not isinstance(meta.get(f"tokenizer.ggml.{key}", ""), str):
            raise ModelLoadError(f"{where}: metadata tokenizer.ggml.{key} is not a string")
    if not isinstance(meta.get("tokenizer.chat_template", ""), str):
        raise ModelLoadError(f"{where}: metadata tokenizer.chat_template is not a string")
    for key in (*SPECIAL_ID_KEYS, *EOS_ID_KEYS):
        value = meta.get(f"tokenizer.ggml.{key}", 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelLoadError(f"{where}: metadata tokenizer.ggml.{key} is not an integer")
    if meta.get("tokenizer.ggml.model") == "llama":
        long = next((i for i, t in enumerate(tokens) if len(t) > MAX_SPM_PIECE), None)
        if long is not None:
            raise ModelLoadError(
                f"{where}: SentencePiece token {long} is {len(tokens[long])} characters long "
                f"(at most {MAX_SPM_PIECE})"
            )


def check_merges(merges: list[Any], vocab: Mapping[str, int], where: str) -> None:
    """Each merge is ``"a b"`` with ``a``, ``b`` and ``ab`` in the vocabulary."""
    for i, merge in enumerate(merges):
        parts = (*merge, "".join(merge))
        if len(merge) != 2 or not all(merge) or any(p not in vocab for p in parts):
            shown = " ".join(merge)
            raise ModelLoadError(
                f"{where}: metadata tokenizer.ggml.merges[{i}] = {shown!r:.40} is not two "
                "tokens whose join is a token"
            )


def check_tokenizer_metadata(meta: Mapping[str, Any], where: str) -> str:
    """The tokenizer model kind (``gpt2`` or ``llama``) of metadata that ``check_metadata``
    finds well formed, else ``ModelLoadError``."""
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise ModelLoadError(
            f"{where}: tokenizer model {kind!r} is not supported ('gpt2' byte-level BPE, "
            "'llama' SentencePiece BPE)"
        )
    if "tokenizer.ggml.tokens" not in meta:
        raise ModelLoadError(f"{where}: missing metadata tokenizer.ggml.tokens")
    check_metadata(meta, where)
    return str(kind)
