"""The compile cache and the matcher records on their own: LRU bound, cached refusals, threads
compiling at once, both tokenizer kinds (tokenizer.json and GGUF), and the record sync rule."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.constraints import Grammar
from engine.constraints.compiler import GrammarCompiler, check_grammar, compiler_for
from engine.errors import GrammarRejected
from engine.params import SamplingParams
from engine.runtime.grammar.matchers import GrammarStates
from engine.runtime.model.gguf import GGUFFile
from engine.text.gguf_tokenizer import gguf_tokenizer
from engine.text.tokenizer import Tokenizer
from tests.engine._tiny_model import tiny_model_dir
from tests.engine.grammar._schemas import PERSON_GRAMMAR
from tests.engine.model.gguf_factory import write_tiny_gguf

DOC = '{"name": "Ada", "age": 36, "role": "admin", "tags": ["red", "blue"], ' + (
    '"address": {"city": "London", "zip": "12345"}, "active": true}'
)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_model_dir())


def _regex(i: int) -> Grammar:
    return Grammar("regex", f"x{{{i}}}")


def test_lru_keeps_the_most_recent_digests(tok: Tokenizer) -> None:
    c = GrammarCompiler(tok, capacity=2)
    a, b, d = _regex(1), _regex(2), _regex(3)
    c.compile(a)
    c.compile(b)
    c.compile(a)  # a is now the most recent
    c.compile(d)  # evicts b
    assert c.is_cached(a) and c.is_cached(d) and not c.is_cached(b)
    s = c.stats()
    assert (s.entries, s.hits, s.misses, s.rejected) == (2, 1, 3, 0)
    assert s.compile_seconds >= s.last_compile_seconds > 0.0


def test_refusals_are_cached_with_their_message(tok: Tokenizer) -> None:
    c = GrammarCompiler(tok)
    bad = Grammar("json_schema", '{"type": "array", "uniqueItems": true}')
    for _ in range(3):
        with pytest.raises(GrammarRejected, match=r'Unimplemented keys: \["uniqueItems"\]'):
            c.compile(bad)
    s = c.stats()
    assert (s.misses, s.rejected, s.hits) == (1, 1, 2)


def test_threads_compiling_at_once_all_get_the_grammar(tok: Tokenizer) -> None:
    c = GrammarCompiler(tok)
    grammars = [Grammar("json_schema", json.dumps({"const": i})) for i in range(4)]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for g in grammars * 3:
                m = c.compile(g).matcher()
                assert m.try_consume_tokens(tok.encode(g.source.split(": ")[1][:-1])) > 0
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert c.stats().entries == 4


def test_check_grammar_shares_one_compiler_per_tokenizer_object(tok: Tokenizer) -> None:
    assert compiler_for(tok) is compiler_for(tok)
    other = Tokenizer.from_pretrained(tiny_model_dir())
    assert compiler_for(other) is not compiler_for(tok)
    check_grammar(PERSON_GRAMMAR, tok)
    assert compiler_for(tok).is_cached(PERSON_GRAMMAR)
    m = compiler_for(tok).compile(PERSON_GRAMMAR).matcher()
    ids = tok.encode(DOC)
    assert m.try_consume_tokens(ids) == len(ids) and m.is_stopped()


def test_a_gguf_tokenizer_compiles_and_ends_at_its_eos(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    gtok = gguf_tokenizer(GGUFFile.open(path).metadata, str(path))
    compiled = compiler_for(gtok).compile(Grammar("regex", "the|then"))
    m = compiled.matcher()
    ids = gtok.encode("the")
    assert m.try_consume_tokens(ids) == len(ids) and m.is_accepting() and not m.is_stopped()
    assert compiler_for(gtok).ll_tokenizer.eos_tokens == list(gtok.eos_token_ids)
    with pytest.raises(GrammarRejected):
        check_grammar(Grammar("lark", "start: %json{"), gtok)


def test_records_follow_the_token_list(tok: Tokenizer) -> None:
    """sync catches a record up with the tokens it has not seen, rolls back any the request no
    longer has, and rebuilds for a new list under the same id."""
    states = GrammarStates(compiler_for(tok), tok.eos_token_ids)
    p = SamplingParams(grammar=PERSON_GRAMMAR)
    doc = tok.encode(DOC)
    history = [5, 6, *doc[:3]]
    rows = states.sync(["r"], [p], [history], [3])
    assert len(rows) == 1 and len(states) == 1
    states.check_integrity()
    history += doc[3:6]
    ((_, m),) = states.sync(["r"], [p], [history], [6])
    states.check_integrity()
    del history[-2:]  # the request lost two tokens (rolled back, not rebuilt)
    ((_, again),) = states.sync(["r"], [p], [history], [4])
    assert again is m and states.builds == 1
    states.check_integrity()
    fresh = [5, 6, *doc[:4]]  # same id, another list: a new record
    ((_, other),) = states.sync(["r"], [p], [fresh], [4])
    assert other is not m and states.builds == 2
    assert states.sync(["q"], [SamplingParams()], [[1, 2]], [0]) == [] and len(states) == 0


def test_the_gateway_side_imports_no_torch() -> None:
    """The gateway checks grammars before admission; a gateway in front of workers has no
    torch to spare for it."""
    code = "import sys, engine.runtime.grammar; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
