"""The batched sampler through the engine: seeded requests keep their tokens whatever runs beside
them, logprobs match transformers' log-softmax on the same weights, penalties see the tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine import Engine
from engine.params import SamplingParams
from tests.engine.model.factories import make_hf_model, random_prompt


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    return make_hf_model(tmp_path_factory.mktemp("sampling"), arch="qwen2", std=0.3)


def _engine(path: Path, **overrides: Any) -> Engine:
    return Engine.from_pretrained(
        path, block_size=4, kv_cache_bytes=2 << 20, device="cpu", dtype="float32", **overrides
    )


def test_seeded_requests_keep_their_tokens_in_any_batch(hf: tuple[Path, Any]) -> None:
    eng = _engine(hf[0])
    prompts = [random_prompt(9 + i, seed=i) for i in range(4)]
    seeded = [
        SamplingParams(max_tokens=6, temperature=1.0, seed=40 + i, ignore_eos=True, top_p=0.95)
        for i in range(4)
    ]
    alone = [eng.generate([p], sp)[0].token_ids for p, sp in zip(prompts, seeded, strict=True)]
    noise = SamplingParams(max_tokens=9, temperature=1.5, ignore_eos=True)
    order = [2, 0, 3, 1]
    mixed = eng.generate(
        [random_prompt(5, 77)] + [prompts[i] for i in order] + [random_prompt(30, 78)],
        [noise] + [seeded[i] for i in order] + [noise],
    )
    assert [o.token_ids for o in mixed[1:5]] == [alone[i] for i in order]
    # The engine step budget splits prefill differently: still the same draws.
    small = _engine(hf[0], max_num_batched_tokens=5).generate(prompts, seeded)
    assert [o.token_ids for o in small] == alone


def test_greedy_logprobs_match_transformers(hf: tuple[Path, Any]) -> None:
    path, model = hf
    prompt = random_prompt(11, seed=3)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=4)
    tokens, logprobs = _run(_engine(path), prompt, params)
    assert len(logprobs) == len(tokens) == 5
    ids = list(prompt)
    for tok, entry in zip(tokens, logprobs, strict=True):
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
        assert entry.token_id == tok == int(lp.argmax())
        assert abs(entry.logprob - float(lp[tok])) < 1e-4
        top = torch.topk(lp, 4)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert (
            max(abs(a - float(b)) for (_, a), b in zip(entry.top, top.values, strict=True)) < 1e-4
        )
        ids.append(tok)


def _run(eng: Engine, prompt: list[int], params: SamplingParams) -> tuple[list[int], list[Any]]:
    """Step one request to the end; its tokens and the logprobs of every output delta."""
    eng.add_request(prompt, params, request_id="r")
    tokens: list[int] = []
    logprobs: list[Any] = []
    while eng.has_unfinished():
        for out in eng.step():
            assert out.new_logprobs is not None
            assert [e.token_id for e in out.new_logprobs] == list(out.new_token_ids)
            tokens += out.new_token_ids
            logprobs += out.new_logprobs
    return tokens, logprobs


def test_sampled_logprobs_follow_the_tokens(hf: tuple[Path, Any]) -> None:
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=5, ignore_eos=True, logprobs=0)
    tokens, logprobs = _run(_engine(hf[0]), random_prompt(6, seed=9), params)
    assert len(tokens) == 4 and all(e.top == () and e.logprob <= 0 for e in logprobs)


def test_presence_penalty_and_bias_change_what_is_generated(hf: tuple[Path, Any]) -> None:
    eng = _engine(hf[0])
    prompt = random_prompt(8, seed=4)
    base = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    # Bias one token so high that greedy repeats it, then a penalty large enough to stop that.
    forced = eng.generate([prompt], SamplingParams(**{**_fields(base), "logit_bias": ((7, 60.0),)}))
    assert set(forced[0].token_ids) == {7}
    with_penalty = SamplingParams(
        **{**_fields(base), "logit_bias": ((7, 3.0),), "repetition_penalty": 50.0}
    )
    out = eng.generate([prompt], with_penalty)[0].token_ids
    assert len(set(out)) == len(out)  # a token seen (prompt or output) is penalized away


def _fields(p: SamplingParams) -> dict[str, Any]:
    return {f: getattr(p, f) for f in p.__dataclass_fields__}
