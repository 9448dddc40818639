"""Demo model (byte-identical, loads in HF), tokenizer, chat template, streaming detokenizer."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from engine.runtime.model.demo import main as demo_main
from engine.runtime.model.demo import write_demo_model
from engine.text.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.engine.model.factories import hf_last_logits, logits_of, make_runner, seq

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are kvgate's helpful assistant."},
        {"role": "user", "content": "Summarize: the quick brown fox."},
        {"role": "assistant", "content": "A fox jumps."},
        {"role": "user", "content": "Über naïve café — 你好 🙂"},
    ],
]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("demo") / "model")


def _digest(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_demo_model_is_byte_identical_on_every_run(demo_dir: Path, tmp_path: Path) -> None:
    assert demo_main(["demo-model", str(tmp_path / "again")]) == 0
    assert _digest(tmp_path / "again") == _digest(demo_dir)
    names = set(_digest(demo_dir))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names


def test_demo_model_loads_in_transformers_with_same_logits(demo_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(demo_dir)
    hf = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).eval()
    tok = Tokenizer.from_pretrained(demo_dir)
    ids = tok.encode("Hello! How can I help you today?")
    assert ids == hf_tok.encode("Hello! How can I help you today?", add_special_tokens=False)
    runner = make_runner(demo_dir, block_size=16, num_blocks=8)
    assert runner.tokenizer.vocab_size == 2000 and runner.max_model_len == 4096
    got = logits_of(runner, seq("a", ids, 0, [0, 1]))[0]
    assert (got - hf_last_logits(hf, ids)).abs().max().item() <= 1e-4


def test_chat_template_matches_transformers(demo_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(demo_dir)
    tok = Tokenizer.from_pretrained(demo_dir)
    for messages in CONVERSATIONS:
        for gen in (True, False):
            want = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert tok.apply_chat_template(messages, add_generation_prompt=gen) == want


def test_encode_decode_and_special_tokens(demo_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(demo_dir)
    end, start = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|im_start|>")
    assert tok.eos_token_ids[0] == end and tok.token_to_id("<|endoftext|>") in tok.eos_token_ids
    text = "The quick brown fox jumps over the lazy dog."
    ids = tok.encode(text)
    assert end not in ids and start not in ids  # nothing added unless asked
    assert tok.decode(ids) == text
    chat = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert chat[0] == start and chat[-1] == end
    assert tok.decode(chat) == "user\nhi"
    assert tok.decode(chat, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"


def test_encoding_is_the_backends_encode_without_holding_the_gil(demo_dir: Path) -> None:
    """``encode`` and ``encoding`` give the backend's own ``encode`` ids (special tokens
    matched, added when asked); they go through ``encode_batch_fast``, which releases the GIL
    (gateway/prompts/tenant_prefix.py relies on it), and ``encoding`` counts without making the
    ids."""
    tok = Tokenizer.from_pretrained(demo_dir)
    for text in ("plain words", "<|im_start|>system\nBe brief.<|im_end|>\n", "é " * 500):
        for special in (False, True):
            own = tok.backend.encode(text, add_special_tokens=special).ids
            assert tok.encoding(text, special).ids == own
            assert len(tok.encoding(text, special)) == len(own)
            assert tok.encode(text, special)[-len(own) :] == own


def test_incremental_detokenizer_never_splits_characters(demo_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(demo_dir)
    text = "Grüße 🙂 你好, kvgate! ∑ naïve — done."
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text
    assert sum(1 for p in pieces if p == "") > 0  # multi-byte characters were held back


def test_chat_template_helpers(tmp_path: Path, demo_dir: Path) -> None:
    from engine.text.chat_template import TemplateError, render_chat

    source = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{{ bos_token }}{{ messages | tojson }}{% generation %}[{{ strftime_now('%Y') | length }}]"
        "{% endgeneration %}"
    )
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    out = render_chat(
        source,
        [{"role": "user", "content": "é"}],
        add_generation_prompt=True,
        special_tokens=special,
    )
    assert out == '<s>[{"role": "user", "content": "é"}][4]'
    with pytest.raises(TemplateError, match="user first"):
        render_chat(
            source,
            [{"role": "system", "content": ""}],
            add_generation_prompt=True,
            special_tokens=special,
        )
