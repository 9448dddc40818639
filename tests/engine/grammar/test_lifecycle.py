"""The matcher's life beside the engine's: logprobs from the constrained distribution,
preemption and recompute (host tier on), refusals at admission, and no mask work at all for a
batch without a constrained row."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from engine import Engine, SamplingParams
from engine.constraints import Grammar
from engine.errors import GrammarRejected
from engine.serving.async_engine import AsyncEngine
from tests.engine._tiny_model import kv_bytes, prompt, tiny_model_dir
from tests.engine.grammar._schemas import PERSON, PERSON_GRAMMAR, tiny_engine

CHOICE = Grammar("json_schema", json.dumps({"enum": ["alpha", "beta", "gamma"]}))


def test_logprobs_come_from_the_constrained_distribution() -> None:
    eng = tiny_engine()
    ids = prompt(11, 10)
    free = eng.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, logprobs=5))[0]
    params = SamplingParams(max_tokens=10, temperature=0.0, logprobs=5, grammar=CHOICE)
    out = eng.generate([ids], params)[0]
    assert out.new_logprobs is not None
    first = out.new_logprobs[0]
    quote = eng.tokenizer.encode('"')[0]
    # Only '"' may start the output: the whole constrained mass is on it, no alternative.
    assert first.token_id == quote and first.logprob == 0.0 and first.top == ((quote, 0.0),)
    assert free.new_logprobs is not None and free.new_logprobs[0].top[0][0] != quote
    for entry in out.new_logprobs:
        assert entry.top and entry.top[0][1] >= entry.logprob - 1e-9
        assert all(math.isfinite(lp) for _, lp in entry.top)  # no -inf alternatives reported
        assert sum(math.exp(lp) for _, lp in entry.top) <= 1.0 + 1e-6
    text = eng.tokenizer.decode(list(out.token_ids), skip_special_tokens=True)
    assert json.loads(text) in ("alpha", "beta", "gamma")


def _run_stepping(eng: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> dict:
    """Step to the end, checking the scheduler, cache and grammar states after every step."""
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        eng.add_request(p, sp, request_id=f"r{i}")
    finals = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
        eng.check_integrity()
        eng.core.runner.grammar.check_integrity()
    return finals


def test_preemption_and_recompute_rebuild_the_matchers() -> None:
    """A pool far too small for the batch: requests are preempted mid-document, recompute (part
    of their prompt restored from the host tier) and continue from a matcher rebuilt from their
    tokens. Seeded draws do not depend on the batch, so the documents are the big pool's."""
    prompts = [prompt(500 + i, 12) for i in range(6)]
    params = [
        SamplingParams(max_tokens=200, temperature=1.0, seed=70 + i, grammar=PERSON_GRAMMAR)
        for i in range(6)
    ]
    roomy = _run_stepping(tiny_engine(), prompts, params)
    small = tiny_engine(num_blocks=64, host_kv_bytes=kv_bytes(64, 4))
    finals = _run_stepping(small, prompts, params)
    assert small.scheduler.num_preemptions > 0, "the workload must actually preempt"
    assert small.core.runner.grammar.stats().builds > len(prompts), "matchers were rebuilt"
    assert small.cache_stats().host_blocks_total > 0
    for rid, out in finals.items():
        assert out.finish_reason == "stop"
        assert out.token_ids == roomy[rid].token_ids
        jsonschema.validate(json.loads(small.tokenizer.decode(list(out.token_ids))), PERSON)


def test_a_batch_without_a_constrained_row_does_no_mask_work() -> None:
    eng = tiny_engine()
    runner = eng.core.runner
    plain = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=3)
    eng.generate([prompt(1, 10), prompt(2, 10)], plain)
    masks = runner.grammar.stats().masks
    assert (masks.steps, masks.rows, masks.copies) == (0, 0, 0)
    # One constrained row beside a plain one: the plain row's tokens and logprobs are bitwise
    # those of the same batch without any grammar (the mask touches only its own row).
    constrained = SamplingParams(max_tokens=8, temperature=0.0, grammar=PERSON_GRAMMAR)
    base = eng.generate([prompt(1, 10), prompt(3, 10)], [plain, plain])
    mixed = eng.generate([prompt(1, 10), prompt(3, 10)], [plain, constrained])
    assert mixed[0].token_ids == base[0].token_ids
    assert mixed[0].new_logprobs == base[0].new_logprobs
    masks = runner.grammar.stats().masks
    assert masks.steps == 8 and masks.rows == 8  # one mask per step, for the one row
    assert masks.waits <= masks.steps and masks.wait_seconds >= 0.0
    eng.generate([prompt(4, 10)], plain)
    assert runner.grammar.stats().masks.steps == 8, "unconstrained steps after it: none either"


BAD = [
    (Grammar("json_schema", '{"type": "object", "properties": {'), "not valid JSON"),
    (Grammar("json_schema", '{"type": "string", "not": {"const": "x"}}'), '"not"'),
    (Grammar("json_schema", '{"type": "integer", "minimum": 5, "maximum": 1}'), "Unsatisfiable"),
    (Grammar("json_schema", '{"type": "string", "format": "ipv9"}'), "Unknown format"),
    (Grammar("lark", "start: missing_rule"), "unknown name"),
    (Grammar("regex", "[a-z"), "regex"),
]


@pytest.mark.parametrize(("grammar", "says"), BAD)
def test_bad_grammars_are_refused_at_admission(grammar: Grammar, says: str) -> None:
    eng = tiny_engine(num_blocks=64)
    with pytest.raises(GrammarRejected, match=says) as info:
        eng.generate([prompt(1, 5)], SamplingParams(max_tokens=4, grammar=grammar))
    assert info.value.param == "response_format"
    assert not eng.has_unfinished() and eng.num_model_tokens == 0  # nothing ran


async def test_async_generate_refuses_at_the_first_anext_and_keeps_serving() -> None:
    aeng = AsyncEngine.from_pretrained(
        tiny_model_dir(), block_size=4, kv_cache_bytes=kv_bytes(128, 4), device="cpu",
        dtype="float32",
    )  # fmt: skip
    async with aeng:
        stream = aeng.generate(prompt(1, 5), SamplingParams(max_tokens=4, grammar=BAD[1][0]))
        with pytest.raises(GrammarRejected, match="Unimplemented keys"):
            await anext(stream)
        good = SamplingParams(max_tokens=40, temperature=1.0, grammar=CHOICE)
        outs = [out async for out in aeng.generate(prompt(2, 5), good)]
        assert outs[-1].finish_reason == "stop" and aeng.is_running
        text = aeng.tokenizer.decode(list(outs[-1].token_ids))
        assert json.loads(text) in ("alpha", "beta", "gamma")
