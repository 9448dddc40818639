"""The tokenizer a GGUF file describes, built with ``tokenizers`` from its metadata.

Byte-level BPE (``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen2, SmolLM, ...) from
``tokenizer.ggml.tokens`` / ``merges`` / ``token_type``. The pre-tokenizer follows
``tokenizer.ggml.pre``, the name llama.cpp gives the split its merges were learned with:

    smollm          digits one by one, then GPT-2's byte-level split (SmolLM's tokenizer.json)
    llama-bpe, ...  the Llama 3 split regex (numbers in runs of up to 3 digits)
    qwen2, ...      the Qwen2 split regex (digits one by one), NFC normalization
    anything else   GPT-2's byte-level split

SentencePiece BPE (``"llama"``: Llama 2, Mistral, TinyLlama) from the tokens and their scores:
merges rebuilt from the vocabulary (best score first), ``▁`` for spaces with one prefixed to the
text, byte-fallback tokens (``<0x0A>``) for anything else; BOS added unless the file says not.

Control tokens (type 3) become special added tokens (skipped when decoding), user-defined ones
(type 4) plain added tokens, so both are matched whole in text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from engine.text.errors import ModelLoadError
from engine.text.gguf_checks import check_merges, check_tokenizer_metadata
from engine.text.text_bound import byte_alphabet
from engine.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer as Backend
    from tokenizers.pre_tokenizers import PreTokenizer

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


def _spelled(token: str, alphabet: set[str]) -> str:
    """The token in the byte alphabet, as the BPE model sees it (``<|im_end|>`` already is)."""
    if set(token) <= alphabet:
        return token
    spelling = byte_alphabet()
    return "".join(spelling[b] for b in token.encode("utf-8"))


def _pre_tokenizer(pre: str | None) -> PreTokenizer:
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


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges a SentencePiece vocabulary implies: every split of a token into two tokens,
    ranked by the merged token's score (best first), ties by piece length then id."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for token, score in zip(tokens, scores, strict=True):
        pairs = [(token[:k], token[k:]) for k in range(1, len(token))]
        pairs = [(a, b) for a, b in pairs if a in vocab and b in vocab]
        pairs.sort(key=lambda ab: (vocab[ab[0]], vocab[ab[1]]))
        ranked += [(a, b, score) for a, b in pairs]
    ranked.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in ranked]


def _spm_backend(meta: Mapping[str, Any]) -> Backend:
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    scores = [float(s) for s in meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)]
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(
        vocab=vocab, merges=spm_merges(tokens, scores), fuse_unk=True, byte_fallback=True
    )
    backend = Backend(bpe)
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    return _add_tokens(backend, meta, alphabet=None)


def byte_level_vocab(tokens: list[str]) -> dict[str, int]:
    alphabet = set(byte_alphabet().values())
    return {_spelled(t, alphabet): i for i, t in enumerate(tokens)}


def byte_level_merges(meta: Mapping[str, Any]) -> list[tuple[str, ...]]:
    return [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]


def _byte_level_backend(meta: Mapping[str, Any]) -> Backend:
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers, processors

    alphabet = set(byte_alphabet().values())
    vocab = byte_level_vocab(meta["tokenizer.ggml.tokens"])
    # pairs: _backend checked each merge to be two tokens (check_merges) before this runs
    merges = cast("list[tuple[str, str]]", byte_level_merges(meta))
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
    return _add_tokens(backend, meta, alphabet)


def _add_tokens(backend: Backend, meta: Mapping[str, Any], alphabet: set[str] | None) -> Backend:
    """Control tokens as special added tokens, user-defined ones as plain added tokens. In a
    byte-level vocabulary one outside the byte alphabet is a mislabel llama.cpp tolerates."""
    from tokenizers import AddedToken

    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    ok = [alphabet is None or set(t) <= alphabet for t in tokens]
    for kind, special in ((CONTROL, True), (USER_DEFINED, False)):
        added = [
            AddedToken(t, normalized=False, special=special)
            for t, k, fits in zip(tokens, types, ok, strict=True)
            if k == kind and fits
        ]
        if special:
            backend.add_special_tokens(added)
        else:
            backend.add_tokens(added)
    return backend


def _eos_ids(meta: Mapping[str, Any]) -> list[int]:
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    return [int(meta[f"tokenizer.ggml.{k}"]) for k in keys if f"tokenizer.ggml.{k}" in meta]


def _backend(meta: Mapping[str, Any], kind: str, where: str) -> Backend:
    if kind == "gpt2":
        vocab = byte_level_vocab(meta["tokenizer.ggml.tokens"])
        check_merges(byte_level_merges(meta), vocab, where)
    try:
        return _spm_backend(meta) if kind == "llama" else _byte_level_backend(meta)
    except ModelLoadError:
        raise
    except Exception as exc:  # tokenizers raises a bare Exception subclass
        raise ModelLoadError(f"{where}: cannot build the tokenizer: {exc}") from exc


def gguf_tokenizer(meta: Mapping[str, Any], where: str) -> Tokenizer:
    """``Tokenizer`` (with chat template, special tokens and EOS ids) from GGUF metadata."""
    kind = check_tokenizer_metadata(meta, where)
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
        # SentencePiece files without the flag are Llama 2 style: BOS first.
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")),
    }
    backend = _backend(meta, kind, where)
    return Tokenizer(backend, config, _eos_ids(meta))
