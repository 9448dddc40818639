"""The tokenizer a GGUF file describes, built with ``tokenizers`` from its metadata.

Byte-level BPE (``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen2, SmolLM, ...) from
``tokenizer.ggml.tokens`` / ``merges`` / ``token_type``. The pre-tokenizer follows
``tokenizer.ggml.pre``, the name llama.cpp gives the split its merges were learned with:

    smollm          digits one by one, then GPT-2's byte-level split (SmolLM's tokenizer.json)
    llama-bpe, ...  the Llama 3 split regex (numbers in runs of up to 3 digits)
    qwen2, ...      the Qwen2 split regex (digits one by one), NFC normalization
    anything else   GPT-2's byte-level split

Control tokens (type 3) become special added tokens (skipped when decoding), user-defined ones
(type 4) plain added tokens, so both are matched whole in text.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from engine.model.config import ModelLoadError
from engine.model.tokenizer import Tokenizer

CONTROL, USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}
NFC_PRE = ("qwen2", "deepseek-r1-qwen", "megrez")
DIGIT_PRE = ("smollm", "codeshell")


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


def _spelled(token: str, alphabet: set[str]) -> str:
    """The token in the byte alphabet, as the BPE model sees it (``<|im_end|>`` already is)."""
    if set(token) <= alphabet:
        return token
    spelling = byte_alphabet()
    return "".join(spelling[b] for b in token.encode("utf-8"))


def _pre_tokenizer(pre: str | None) -> Any:
    from tokenizers import Regex, pre_tokenizers

    split = SPLITS.get(pre or "")
    if split is not None:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in DIGIT_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


def _backend(meta: Mapping[str, Any]) -> Any:
    from tokenizers import AddedToken, decoders, models, normalizers, processors
    from tokenizers import Tokenizer as Backend

    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    alphabet = set(byte_alphabet().values())
    vocab = {_spelled(t, alphabet): i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    bpe = models.BPE(
        vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="",
        fuse_unk=False, byte_fallback=False,
    )  # fmt: skip
    backend = Backend(bpe)
    pre = meta.get("tokenizer.ggml.pre")
    if pre in NFC_PRE:
        backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = _pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    # A control token outside the byte alphabet is a mislabel llama.cpp tolerates: not added.
    backend.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, kind in zip(tokens, types, strict=True)
            if kind == CONTROL and set(t) <= alphabet
        ]
    )
    backend.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, kind in zip(tokens, types, strict=True)
            if kind == USER_DEFINED and set(t) <= alphabet
        ]
    )
    return backend


def _eos_ids(meta: Mapping[str, Any]) -> list[int]:
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    return [int(meta[f"tokenizer.ggml.{k}"]) for k in keys if f"tokenizer.ggml.{k}" in meta]


def gguf_tokenizer(meta: Mapping[str, Any], where: str) -> Tokenizer:
    """``Tokenizer`` (with chat template, special tokens and EOS ids) from GGUF metadata."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(
            f"{where}: tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' only)"
        )
    if "tokenizer.ggml.tokens" not in meta:
        raise ModelLoadError(f"{where}: missing metadata tokenizer.ggml.tokens")
    tokens = meta["tokenizer.ggml.tokens"]

    def text(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}")
        return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None

    config = {
        "chat_template": meta.get("tokenizer.chat_template"),
        "bos_token": text("bos_token_id"),
        "eos_token": text("eos_token_id"),
        "unk_token": text("unknown_token_id"),
        "pad_token": text("padding_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    }
    return Tokenizer(_backend(meta), config, _eos_ids(meta))
