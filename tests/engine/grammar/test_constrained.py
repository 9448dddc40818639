"""Constrained decoding through the real engine (tiny random model): every output of a strict
JSON schema validates, lark and regex grammars hold, EOS only where the grammar accepts, and
every sampling parameter still applies inside the mask."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import Engine, SamplingParams
from engine.constraints import Grammar
from engine.constraints.compiler import compiler_for
from tests.engine._tiny_model import prompt
from tests.engine.grammar._schemas import PERSON, PERSON_GRAMMAR, tiny_engine


@pytest.fixture(scope="module")
def eng() -> Engine:
    return tiny_engine()


def _text(eng: Engine, ids: tuple[int, ...]) -> str:
    return eng.tokenizer.decode(list(ids), skip_special_tokens=False)


def test_fifty_samples_at_temperature_one_validate(eng: Engine) -> None:
    params = SamplingParams(max_tokens=200, temperature=1.0, grammar=PERSON_GRAMMAR)
    outs = eng.generate([prompt(i, 12) for i in range(50)], params)
    validator = jsonschema.Draft202012Validator(PERSON)
    eos = set(eng.tokenizer.eos_token_ids)
    texts = set()
    for out in outs:
        text = _text(eng, out.token_ids)
        assert out.finish_reason == "stop", text
        validator.validate(json.loads(text))  # raises with the failing path
        assert not eos & set(out.token_ids), "the grammar ended the output, not an EOS"
        texts.add(text)
    assert len(texts) > 40, "temperature 1.0 draws different documents"
    assert eng.core.runner.grammar.stats().matchers == 0, "finished requests keep no matcher"


def test_lark_and_regex_grammars(eng: Engine) -> None:
    lark = Grammar("lark", 'start: answer " " num\nanswer: "yes" | "no"\nnum: /[1-9][0-9]{0,2}/')
    regex = Grammar("regex", r"[a-e]{2,5}-[0-9]{2}(\.[xyz])?")
    grammars = [lark] * 10 + [regex] * 10
    params = [SamplingParams(max_tokens=40, temperature=1.0, grammar=g) for g in grammars]
    outs = eng.generate([prompt(100 + i, 10) for i in range(20)], params)
    for out, g in zip(outs, grammars, strict=True):
        text = _text(eng, out.token_ids).removesuffix("<|im_end|>").removesuffix("<|endoftext|>")
        pattern = r"(yes|no) [1-9][0-9]{0,2}" if g is lark else g.source
        assert out.finish_reason == "stop"
        assert re.fullmatch(pattern, text), (g.kind, text)


def _eos_bias(eng: Engine, bias: float) -> tuple[tuple[int, float], ...]:
    return tuple((t, bias) for t in eng.tokenizer.eos_token_ids)


def test_eos_only_where_the_grammar_accepts(eng: Engine) -> None:
    """EOS pushed far above everything: unconstrained it comes first; under the grammar it is
    masked until the output is a full match, and taken at the first accepting point."""
    regex = Grammar("regex", "[a-c]{3,30}")
    biased = SamplingParams(max_tokens=40, temperature=0.0, logit_bias=_eos_bias(eng, 100.0))
    free = eng.generate([prompt(7, 10)], biased)[0]
    assert free.token_ids[0] in eng.tokenizer.eos_token_ids
    out = eng.generate([prompt(7, 10)], SamplingParams(**{**vars(biased), "grammar": regex}))[0]
    *body, last = out.token_ids
    assert out.finish_reason == "stop" and last in eng.tokenizer.eos_token_ids
    assert re.fullmatch("[a-c]{3,30}", _text(eng, tuple(body)))
    # Every earlier token boundary was short of three characters: EOS was not allowed there.
    assert all(len(_text(eng, tuple(body[:i]))) < 3 for i in range(len(body)))


def test_ignore_eos_runs_until_the_grammar_stops(eng: Engine) -> None:
    regex = Grammar("regex", "[a-c]{3,30}")
    params = SamplingParams(
        max_tokens=60, temperature=0.0, ignore_eos=True, logit_bias=_eos_bias(eng, 100.0),
        grammar=regex,
    )  # fmt: skip
    out = eng.generate([prompt(7, 10)], params)[0]
    text = _text(eng, out.token_ids)
    assert out.finish_reason == "stop" and re.fullmatch("[a-c]{30}", text), text


def test_stop_tokens_end_the_output_where_the_grammar_accepts(eng: Engine) -> None:
    stop = eng.tokenizer.token_to_id("<|im_start|>")
    assert stop is not None
    params = SamplingParams(
        max_tokens=40, temperature=0.0, ignore_eos=True, stop_token_ids=(stop,),
        logit_bias=((stop, 100.0),), grammar=Grammar("regex", "[a-c]{3,30}"),
    )  # fmt: skip
    out = eng.generate([prompt(8, 10)], params)[0]
    *body, last = out.token_ids
    assert out.finish_reason == "stop" and last == stop
    assert re.fullmatch("[a-c]{3,30}", _text(eng, tuple(body)))


def test_max_tokens_before_the_grammar_ends_is_length(eng: Engine) -> None:
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=3, grammar=PERSON_GRAMMAR)
    out = eng.generate([prompt(9, 10)], params)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    assert _text(eng, out.token_ids).startswith('{"name"')  # the schema's first key


def test_every_sampling_parameter_inside_the_mask(eng: Engine) -> None:
    """Penalties, logit bias, min-p / top-k / top-p and seeds all act on the allowed tokens:
    outputs stay valid, and a seeded constrained request draws the same tokens in any batch."""
    g = PERSON_GRAMMAR
    variants = [
        SamplingParams(max_tokens=200, temperature=0.7, top_p=0.9, seed=1, grammar=g),
        SamplingParams(max_tokens=200, temperature=1.3, top_k=5, seed=2, grammar=g),
        SamplingParams(max_tokens=200, temperature=1.0, min_p=0.05, seed=3, grammar=g),
        SamplingParams(
            max_tokens=200,
            temperature=1.0,
            seed=4,
            presence_penalty=1.5,
            frequency_penalty=1.0,
            repetition_penalty=1.3,
            grammar=g,
        ),
        # "red" pushed up, "blue" effectively banned: the tags only ever say red / green
        SamplingParams(
            max_tokens=200,
            temperature=1.0,
            seed=5,
            grammar=g,
            logit_bias=_word_bias(eng, "red", 8.0) + _word_bias(eng, "blue", -100.0),
        ),
        SamplingParams(max_tokens=200, temperature=0.0, grammar=g),
    ]
    prompts = [prompt(200 + i, 10) for i in range(len(variants))]
    alone = [eng.generate([p], v)[0] for p, v in zip(prompts, variants, strict=True)]
    mixed = eng.generate(
        [prompt(300, 7), *prompts], [SamplingParams(max_tokens=30, temperature=1.0), *variants]
    )[1:]
    validator = jsonschema.Draft202012Validator(PERSON)
    for a, b in zip(alone, mixed, strict=True):
        assert a.token_ids == b.token_ids  # seeded or greedy: the batch does not matter
        validator.validate(json.loads(_text(eng, a.token_ids)))
    assert "blue" not in json.loads(_text(eng, alone[4].token_ids))["tags"]


def _word_bias(eng: Engine, word: str, bias: float) -> tuple[tuple[int, float], ...]:
    return tuple((t, bias) for t in eng.tokenizer.encode(word))


def test_n_choices_each_have_their_own_matcher(eng: Engine) -> None:
    """The n choices of one chat request are n engine requests with one grammar: one compile,
    n matchers, n valid and different documents."""
    g = Grammar("json_schema", json.dumps({**PERSON, "title": "n-choices"}))  # a new digest
    compiler = compiler_for(eng.tokenizer)
    before, builds = compiler.stats(), eng.core.runner.grammar.stats().builds
    params = SamplingParams(max_tokens=200, temperature=1.0, grammar=g)
    outs = eng.generate([prompt(400, 10)] * 4, params)
    assert compiler.stats().misses == before.misses + 1
    assert eng.core.runner.grammar.stats().builds == builds + 4
    docs = [json.loads(_text(eng, o.token_ids)) for o in outs]
    for doc in docs:
        jsonschema.validate(doc, PERSON)
    assert len({json.dumps(d) for d in docs}) > 1
