"""Grammars through a worker process: the grammar travels in SamplingParams over the message
protocol, the worker compiles it (once per digest) and masks its rows; a bad grammar comes back
as GrammarRejected, with its message and param, before anything is generated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from engine.api import GenerateOptions
from engine.constraints import Grammar
from engine.errors import GrammarRejected
from engine.params import SamplingParams
from engine.remote import messages as m
from gateway.cluster.local import LocalWorker
from tests.cluster.workers import KV_CACHE_BYTES, cluster_engine, start_workers, stop_workers
from tests.engine.grammar._schemas import PERSON, PERSON_GRAMMAR


@pytest.fixture(scope="module")
def worker(demo_model_dir: Path) -> Iterator[LocalWorker]:
    workers = start_workers(demo_model_dir, ["g0"])
    yield workers[0]
    stop_workers(workers)


def test_the_grammar_travels_in_the_generate_message() -> None:
    params = SamplingParams(max_tokens=9, temperature=0.5, seed=3, grammar=PERSON_GRAMMAR)
    msg = m.Generate(7, [1, 2, 3], params, GenerateOptions(namespace="n", request_id="r"))
    back = m.decode_request(m.encode(msg))
    assert isinstance(back, m.Generate) and back.params == params
    assert back.params.grammar is not None and back.params.grammar.digest == PERSON_GRAMMAR.digest
    rejected = m.ErrorInfo.of(GrammarRejected("JSON schema: bad", param="tools")).rebuild()
    assert isinstance(rejected, GrammarRejected)
    assert (str(rejected), rejected.param) == ("JSON schema: bad", "tools")
    unknown = m.encode(msg).replace(b"json_schema", b"yaml_schema")  # not a GrammarKind
    with pytest.raises(m.WireError):
        m.decode_request(unknown)


async def test_constrained_generation_on_a_worker(
    worker: LocalWorker, demo_model_dir: Path
) -> None:
    from engine import Engine

    local = Engine.from_pretrained(demo_model_dir, device="cpu", kv_cache_bytes=KV_CACHE_BYTES)
    prompt = [(i * 37) % 1500 + 3 for i in range(20)]
    params = SamplingParams(max_tokens=200, temperature=1.0, seed=11, grammar=PERSON_GRAMMAR)
    want = local.generate([prompt], params)[0]
    engine = await cluster_engine([worker])
    await engine.start()
    try:
        outs = [
            o
            async for o in engine.generate(
                prompt, params, GenerateOptions(namespace="g", request_id="g-1")
            )
        ]
        final = outs[-1]
        assert final.finish_reason == "stop" and final.token_ids == want.token_ids
        doc = json.loads(local.tokenizer.decode(list(final.token_ids)))
        jsonschema.validate(doc, PERSON)
        bad = SamplingParams(max_tokens=5, grammar=Grammar("json_schema", '{"not": {}}'))
        stream = engine.generate(prompt, bad, GenerateOptions(namespace="g", request_id="g-2"))
        with pytest.raises(GrammarRejected, match="Unimplemented keys") as info:
            await anext(stream)
        assert info.value.param == "response_format"
    finally:
        await engine.shutdown()
