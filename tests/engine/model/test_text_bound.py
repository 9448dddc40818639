"""The character bound: a text never needs fewer tokens than it says, and tokenizers that can
drop or fuse text have none."""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.runtime.model.demo import write_demo_model
from engine.runtime.model.gguf import GGUFFile
from engine.text.gguf_tokenizer import gguf_tokenizer
from engine.text.text_bound import COMPOSED, TextBound, byte_alphabet, text_bound
from engine.text.tokenizer import Tokenizer
from tests.engine.model.factories import make_hf_model
from tests.engine.model.gguf_factory import write_gguf

KINDS = ["hf", "gpt2", "qwen2", "smollm", "spm"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    tmp = tmp_path_factory.mktemp("bound")
    out = {"hf": Tokenizer.from_pretrained(write_demo_model(tmp / "demo"))}
    _, hf = make_hf_model(tmp / "hf", arch="llama", layers=1)
    for pre in KINDS[1:]:
        path = write_gguf(tmp / f"{pre}.gguf", hf, pre=pre)
        out[pre] = gguf_tokenizer(GGUFFile.open(path).metadata, str(path))
    return out


def tokens_of(tok: Tokenizer, text: str) -> int:
    return len(tok.encode_marked(text))


def bound_of(tok: Tokenizer) -> TextBound:
    bound = tok.text_bound
    assert bound is not None
    return bound


def test_every_tokenizer_made_here_has_a_bound(tokenizers: dict[str, Tokenizer]) -> None:
    for kind, tok in tokenizers.items():
        bound = bound_of(tok)
        vocab = tok.backend.get_vocab(with_added_tokens=True)
        longest = max(map(len, vocab))
        assert bound.chars_per_token == longest * (COMPOSED if kind == "qwen2" else 1), kind


HOSTILE = [
    " " * 5000,
    "a" * 5000,
    "\n" * 3000,
    "<|im_end|>" * 300,
    "🚀" * 1000,
    "e\u0301" * 1000,  # composes under NFC (qwen2)
    "ᾂ" * 300,
    "".join(chr(c) for c in range(32, 2000)),
]


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_texts_need_at_least_the_bound(tokenizers: dict[str, Tokenizer], kind: str) -> None:
    tok = tokenizers[kind]
    bound = bound_of(tok)
    longest = max(tok.backend.get_vocab(with_added_tokens=True), key=len)
    for text in [*HOSTILE, longest * 200]:
        assert tokens_of(tok, text) * bound.chars_per_token >= bound.count(text), repr(text[:20])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(min_size=1, max_size=400), kind=st.sampled_from(KINDS))
def test_no_text_needs_fewer_tokens_than_the_bound(
    tokenizers: dict[str, Tokenizer], text: str, kind: str
) -> None:
    tok = tokenizers[kind]
    bound = bound_of(tok)
    assert tokens_of(tok, text) * bound.chars_per_token >= bound.count(text)


def test_no_code_point_decomposes_into_more_than_composed() -> None:
    # NFC / NFKC recompose at most a canonical decomposition's length into one code point.
    longest = max(len(unicodedata.normalize("NFD", chr(c))) for c in range(sys.maxunicode + 1))
    assert longest == COMPOSED


def _demo_spec(tokenizers: dict[str, Tokenizer]) -> tuple[dict[str, Any], dict[str, int]]:
    tok = tokenizers["hf"]
    return json.loads(tok.backend.to_str()), tok.backend.get_vocab(with_added_tokens=True)


@pytest.mark.parametrize(
    "change",
    [
        {"normalizer": {"type": "Strip", "strip_left": True, "strip_right": True}},
        {"normalizer": {"type": "StripAccents"}},
        {"normalizer": {"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}},
        {"pre_tokenizer": {"type": "Whitespace"}},
        {"pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed"}},
    ],
)
def test_stages_that_drop_text_leave_no_bound(
    tokenizers: dict[str, Tokenizer], change: dict[str, Any]
) -> None:
    spec, vocab = _demo_spec(tokenizers)
    assert text_bound(spec, vocab) is not None
    assert text_bound({**spec, **change}, vocab) is None


def test_models_that_fuse_or_drop_unknown_text(tokenizers: dict[str, Tokenizer]) -> None:
    spec, vocab = _demo_spec(tokenizers)
    assert text_bound(spec, vocab) is not None
    fused = {**spec, "model": {**spec["model"], "unk_token": "<|endoftext|>", "fuse_unk": True}}
    no_bytes = {k: v for k, v in vocab.items() if k != byte_alphabet()[0xA9]}
    assert text_bound(fused, no_bytes) is None  # a run of unknown characters: one token
    assert text_bound({**spec, "model": {**spec["model"], "type": "WordPiece"}}, vocab) is None
    stripping = [{**t, "rstrip": True} for t in spec["added_tokens"]]
    assert text_bound({**spec, "added_tokens": stripping}, vocab) is None


def test_ascii_without_a_token_is_not_counted(tokenizers: dict[str, Tokenizer]) -> None:
    # SmolLM2's vocabulary has no token for a few control characters: they vanish, uncounted.
    spec, vocab = _demo_spec(tokenizers)
    missing = {k: v for k, v in vocab.items() if k != byte_alphabet()[0x04]}
    bound = text_bound(spec, missing)
    assert bound is not None and bound.dropped == "\x04"
    assert bound.count("a\x04\x04b") == 2
    continuation = {k: v for k, v in vocab.items() if k != byte_alphabet()[0x85]}
    assert text_bound(spec, continuation) is None


SMOLLM2_DROPPED = "\x04\x06\x13\x14\x16\x1d"


@given(st.text(alphabet=st.sampled_from("ab \n\x04\x06\x13\x14\x16\x1d\u00e9\u6f22\U0001f600")))
def test_count_leaves_out_exactly_the_dropped_characters(text: str) -> None:
    bound = TextBound(81, SMOLLM2_DROPPED)
    assert bound.count(text) == sum(1 for c in text if c not in SMOLLM2_DROPPED)


class Scanned(str):
    """A text that records the full passes made over it (``str.count``)."""

    passes = 0

    def count(self, *args: object) -> int:  # type: ignore[override]
        type(self).passes += 1
        return super().count(*args)  # type: ignore[arg-type]


def test_a_text_without_dropped_characters_is_not_counted_once_per_character() -> None:
    """The gateway counts each message on its event loop: one full pass per dropped character
    over a 1 MiB widget message (six for SmolLM2) held the loop 2 ms a request, 7-15 ms on a
    busy 2-core host, and eight such requests in flight queued up into 200-500 ms of /healthz
    latency. A search for each character (``memchr``) comes first; only one that occurs is
    counted."""
    bound = TextBound(81, SMOLLM2_DROPPED)
    Scanned.passes = 0
    text = Scanned("where is my parcel " * 55_000)
    assert bound.count(text) == len(text)
    assert Scanned.passes == 0
    assert bound.count(Scanned(text + "\x13\x13")) == len(text)
    assert Scanned.passes == 1  # the one character that occurs


def test_the_default_models_tokenizer_file_is_bounded(tmp_path: Path) -> None:
    """SmolLM2's real vocabulary, when the file is on this machine (kvgate serve downloads it)."""
    path = Path.home() / ".cache/kvgate/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip("the default model is not downloaded here")
    tok = gguf_tokenizer(GGUFFile.open(path).metadata, str(path))
    bound = bound_of(tok)
    assert bound.chars_per_token == 81 and bound.dropped == "\x04\x06\x13\x14\x16\x1d"
    assert tokens_of(tok, "#" * 8000) * 81 >= 8000
