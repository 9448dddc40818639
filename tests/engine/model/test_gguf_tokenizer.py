"""GGUF metadata -> tokenizer, chat template, special tokens and config; refused files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.runtime.model.config import RopeConfig
from engine.runtime.model.gguf import GGUFFile, parse_gguf_config
from engine.runtime.model.gguf_weights import load_gguf
from engine.runtime.model.rope import inv_freq
from engine.text.errors import ModelLoadError
from engine.text.gguf_tokenizer import gguf_tokenizer
from tests.engine.model.factories import make_hf_model
from tests.engine.model.gguf_factory import write_gguf

pytest.importorskip("accelerate")  # transformers' GGUF loader needs it

TEXT = (
    "Hello world! My rocket order 4711 hasn't arrived since 2024-11-30.\n\n"
    "  Indented   spaces\tand tabs; café, naïve, 日本語 🚀 <|im_start|>user\nok<|im_end|>"
)
MESSAGES = [
    {"role": "user", "content": "Where is order 4711?"},
    {"role": "assistant", "content": "Let me check."},
    {"role": "user", "content": "Thanks!"},
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    _, hf = make_hf_model(tmp_path_factory.mktemp("hf"), arch="llama", layers=1)
    return hf


def _write(tmp_path: Path, model: Any, pre: str) -> Path:
    return write_gguf(tmp_path / "model.gguf", model, pre=pre)


def _hf_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_tokenization_and_chat_template_match_transformers(
    tmp_path: Path, model: Any, pre: str
) -> None:
    path = _write(tmp_path, model, pre)
    ours, theirs = gguf_tokenizer(GGUFFile.open(path).metadata, str(path)), _hf_tokenizer(path)
    ids = ours.encode(TEXT)
    assert ids == theirs(TEXT, add_special_tokens=False)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=False) == TEXT
    for messages in (MESSAGES, [{"role": "system", "content": "Be brief."}, *MESSAGES]):
        rendered = ours.apply_chat_template(messages, add_generation_prompt=True)
        assert rendered == theirs.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert ours.encode(rendered) == theirs(rendered, add_special_tokens=False)["input_ids"]


def test_sentencepiece_tokenizer_matches_transformers(tmp_path: Path, model: Any) -> None:
    path = _write(tmp_path, model, "spm")  # tokenizer.ggml.model "llama": Llama 2, Mistral
    ours, theirs = gguf_tokenizer(GGUFFile.open(path).metadata, str(path)), _hf_tokenizer(path)
    assert ours.add_bos and ours.eos_token_ids == (2,)
    for text in ("My rocket order 4711 has not arrived.", TEXT.replace("<|im_start|>", "<s>")):
        ids = ours.encode(text, add_special_tokens=True)
        assert ids[0] == 1  # BOS
        assert ids == theirs(text)["input_ids"]
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    rendered = ours.apply_chat_template(MESSAGES)
    assert rendered == theirs.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    assert rendered.startswith("<s>[INST] Where is order 4711? [/INST]Let me check.</s>")
    assert ours.encode(rendered) == theirs(rendered, add_special_tokens=False)["input_ids"]


def test_special_tokens_eos_and_digits(tmp_path: Path, model: Any) -> None:
    path = _write(tmp_path, model, "smollm")
    tok = gguf_tokenizer(GGUFFile.open(path).metadata, str(path))
    im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert tok.eos_token_ids == (im_end,)
    assert tok.special_tokens["eos_token"] == "<|im_end|>"
    assert tok.encode("<|im_start|>user")[0] == im_start  # matched whole
    assert tok.decode([im_start, *tok.encode("hi"), im_end]) == "hi"  # control tokens skipped
    # SmolLM's pre-tokenizer splits numbers into single digits.
    digits = tok.encode("4711")
    assert [tok.decode([d]) for d in digits] == ["4", "7", "1", "1"]
    assert "Be brief" in tok.apply_chat_template([{"role": "system", "content": "Be brief"}])


def test_config_from_metadata(tmp_path: Path, model: Any) -> None:
    f = GGUFFile.open(_write(tmp_path, model, "gpt2"))
    cfg = parse_gguf_config(f)
    hf = model.config
    assert (cfg.architecture, cfg.hidden_size, cfg.num_layers) == ("LlamaForCausalLM", 64, 1)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.intermediate_size == hf.intermediate_size and cfg.vocab_size == hf.vocab_size
    assert cfg.rope.theta == hf.rope_parameters["rope_theta"]
    assert cfg.rms_norm_eps == pytest.approx(hf.rms_norm_eps)
    assert cfg.max_position_embeddings == hf.max_position_embeddings
    assert cfg.tie_word_embeddings and not cfg.qkv_bias


def test_rope_freqs_factors_divide_the_frequencies(tmp_path: Path, model: Any) -> None:
    # Llama 3.1+ files store their rope scaling as one divisor per rotary pair.
    factors = np.linspace(1.0, 8.0, 8, dtype=np.float32)
    path = write_gguf(tmp_path / "m.gguf", model, extra={"rope_freqs.weight": factors})
    rope = parse_gguf_config(GGUFFile.open(path)).rope
    plain = inv_freq(RopeConfig(theta=rope.theta), 16)
    assert torch.allclose(inv_freq(rope, 16), plain / torch.from_numpy(factors))


def test_refused_files(tmp_path: Path, model: Any) -> None:
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"nope")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_gguf(not_gguf, "auto", "cpu")
    f = GGUFFile.open(_write(tmp_path, model, "gpt2"))
    with pytest.raises(ModelLoadError, match="unsupported GGUF architecture 'gemma'"):
        parse_gguf_config(GGUFFile(f.path, {**f.metadata, "general.architecture": "gemma"}, {}))
    meta = {**f.metadata, "tokenizer.ggml.model": "bert"}
    with pytest.raises(ModelLoadError, match="tokenizer model 'bert' is not supported"):
        gguf_tokenizer(meta, "x.gguf")
    sliding = {**f.metadata, "llama.attention.sliding_window": 16}
    with pytest.raises(ModelLoadError, match="sliding-window"):
        parse_gguf_config(GGUFFile(f.path, sliding, f.tensors))
