"""The two mask forms agree: the CPU path's bool masks expanded on the fill thread and the
device path's bitmasks expanded by ``allowed_tokens``, for every row subset and chunk; and on
CUDA (when there is one) constrained decoding sends one mask copy per constrained step."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

from engine import Engine, SamplingParams
from engine.runtime.grammar.masks import StepMask, allowed_tokens
from tests.engine._tiny_model import kv_bytes, prompt, tiny_model_dir
from tests.engine.grammar._schemas import PERSON, PERSON_GRAMMAR


def _unpacked(bits: np.ndarray, vocab: int) -> np.ndarray:
    flags = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little").astype(bool)
    out = np.zeros((bits.shape[0], vocab), dtype=bool)
    width = min(vocab, flags.shape[1])
    out[:, :width] = flags[:, :width]
    return out


@pytest.mark.parametrize("vocab", [40, 64, 100])  # shorter than, equal to, past the bitmask
def test_bitmask_expansion_matches_numpy(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    bits = rng.integers(-(2**31), 2**31, size=(5, 2), dtype=np.int64).astype(np.int32)
    got = allowed_tokens(torch.from_numpy(bits), vocab).numpy()
    assert np.array_equal(got, _unpacked(bits, vocab))
    assert got.dtype == np.bool_ and got.shape == (5, vocab)


def test_both_mask_forms_mask_the_same_logits_for_any_rows_and_chunks() -> None:
    rng = np.random.default_rng(0)
    vocab, rows = 70, (0, 2, 3, 6)
    bits = rng.integers(-(2**31), 2**31, size=(len(rows), 3), dtype=np.int64).astype(np.int32)
    row_ids = torch.tensor(rows)
    as_bits = StepMask(rows, row_ids, bits=torch.from_numpy(bits))
    as_bool = StepMask(rows, row_ids, allowed=torch.from_numpy(_unpacked(bits, vocab)))
    logits = torch.randn(8, vocab)
    want = logits.clone()
    for j, r in enumerate(rows):
        want[r, ~torch.from_numpy(_unpacked(bits, vocab)[j])] = float("-inf")
    for mask in (as_bits, as_bool):
        assert torch.equal(mask.apply(logits), want)
        chunks = [(0, 3), (3, 5), (5, 8)]
        parts = []
        for lo, hi in chunks:
            part = mask.rows_of(lo, hi)
            parts.append(logits[lo:hi] if part is None else part.apply(logits[lo:hi]))
        assert torch.equal(torch.cat(parts), want)
    assert as_bits.rows_of(4, 6) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_constrained_decoding_on_cuda_sends_one_copy_per_step() -> None:
    eng = Engine.from_pretrained(
        tiny_model_dir(), block_size=16, kv_cache_bytes=kv_bytes(256, 16), device="cuda",
        dtype="float32",
    )  # fmt: skip
    params = SamplingParams(max_tokens=200, temperature=1.0, grammar=PERSON_GRAMMAR)
    plain = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    outs = eng.generate([prompt(i, 12) for i in range(9)], [params] * 8 + [plain])
    for out in outs[:8]:
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(eng.tokenizer.decode(list(out.token_ids))), PERSON)
    masks = eng.core.runner.grammar.stats().masks
    assert masks.steps > 0 and masks.copies == masks.steps
