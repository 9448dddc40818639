"""Tool-call and response-format grammars, run through the grammar engine itself (llguidance,
on the demo model's tokenizer): what each tool_choice lets a model write and what it refuses,
and that what it lets through is what the parser reads and the fallback renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest
from tokenizers import Tokenizer as Backend

from engine.constraints import Grammar
from gateway.chat.tools.formats import HERMES, LLAMA3, SMOLLM2, ToolFormat
from gateway.chat.tools.grammar import response_format_grammar, tool_grammar
from gateway.chat.tools.models import ResponseFormat, ToolDef
from gateway.chat.tools.parser import ToolCallParser
from gateway.chat.tools.render import call_text

WEATHER = ToolDef.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"$ref": "#/$defs/City"}, "days": {"type": "integer"}},
                "required": ["city"],
                "additionalProperties": False,
                "$defs": {"City": {"type": "string", "enum": ["Lisbon", "Porto"]}},
            },
        },
    }
)
CLOCK = ToolDef.model_validate({"type": "function", "function": {"name": "get_time"}})
TOOLS = [WEATHER, CLOCK]
LISBON = ("get_weather", '{"city": "Lisbon"}')
NOW = ("get_time", "{}")


class Engine:
    """llguidance on a tokenizer: does a grammar let a model write ``text`` (and stop)?"""

    def __init__(self, tokenizer_json: str) -> None:
        self.tok = llguidance.LLTokenizer(tokenizer_json)
        self.backend = Backend.from_str(tokenizer_json)

    def accepts(self, grammar: Grammar, text: str) -> bool:
        if grammar.kind == "lark":
            spec = llguidance.LLMatcher.grammar_from_lark(grammar.source)
        else:
            spec = llguidance.LLMatcher.grammar_from_json_schema(grammar.source)
        error = llguidance.LLMatcher.validate_grammar(spec, self.tok)
        assert not error, error
        matcher = llguidance.LLMatcher(self.tok, spec)
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return matcher.consume_tokens(ids) and matcher.is_accepting()


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path) -> Engine:
    return Engine((demo_model_dir / "tokenizer.json").read_text())


def _calls(fmt: ToolFormat, *calls: tuple[str, str]) -> str:
    return call_text(list(calls), fmt)


@pytest.mark.parametrize("fmt", [HERMES, SMOLLM2, LLAMA3], ids=lambda f: f.name)
def test_required_forces_valid_calls(engine: Engine, fmt: ToolFormat) -> None:
    grammar = tool_grammar(TOOLS, fmt, "required", parallel=True)
    assert grammar is not None and grammar.kind == "lark"
    assert engine.accepts(grammar, _calls(fmt, LISBON))
    assert engine.accepts(grammar, _calls(fmt, LISBON, NOW))
    assert not engine.accepts(grammar, "It is sunny.")  # text is not a call
    assert not engine.accepts(grammar, _calls(fmt, ("get_weather", '{"city": "Paris"}')))  # enum
    assert not engine.accepts(grammar, _calls(fmt, ("get_weather", '{"days": 2}')))  # required
    assert not engine.accepts(grammar, _calls(fmt, ("launch", "{}")))  # no such function
    single = tool_grammar(TOOLS, fmt, "required", parallel=False)
    assert single is not None
    assert engine.accepts(single, _calls(fmt, NOW))
    assert not engine.accepts(single, _calls(fmt, LISBON, NOW))


@pytest.mark.parametrize("fmt", [HERMES, SMOLLM2, LLAMA3], ids=lambda f: f.name)
def test_named_forces_one_call_of_that_function(engine: Engine, fmt: ToolFormat) -> None:
    grammar = tool_grammar([WEATHER], fmt, "named", parallel=True)
    assert grammar is not None
    assert engine.accepts(grammar, _calls(fmt, ("get_weather", '{"city": "Porto", "days": 3}')))
    assert not engine.accepts(grammar, _calls(fmt, NOW))
    assert not engine.accepts(grammar, _calls(fmt, LISBON, LISBON))


@pytest.mark.parametrize("fmt", [HERMES, SMOLLM2, LLAMA3], ids=lambda f: f.name)
def test_auto_lets_text_through_and_constrains_a_started_call(
    engine: Engine, fmt: ToolFormat
) -> None:
    grammar = tool_grammar(TOOLS, fmt, "auto", parallel=True)
    assert grammar is not None
    assert engine.accepts(grammar, "I can answer that myself: it is sunny.")
    assert engine.accepts(grammar, _calls(fmt, LISBON, NOW))
    # once the call has begun, it must be a valid one
    assert not engine.accepts(grammar, _calls(fmt, ("get_weather", '{"city": "Paris"}')))
    opening = fmt.open or "{"
    assert not engine.accepts(grammar, f"{opening} and then some prose")


def test_auto_allows_text_before_a_tagged_call(engine: Engine) -> None:
    grammar = tool_grammar(TOOLS, HERMES, "auto", parallel=False)
    assert grammar is not None
    assert engine.accepts(grammar, "Let me check.\n" + _calls(HERMES, LISBON))
    assert not engine.accepts(grammar, "Let me check.\n" + _calls(HERMES, LISBON, NOW))


@pytest.mark.parametrize("fmt", [HERMES, SMOLLM2, LLAMA3], ids=lambda f: f.name)
def test_what_the_grammar_allows_the_parser_reads(fmt: ToolFormat) -> None:
    parser = ToolCallParser(fmt)
    parser.feed(_calls(fmt, LISBON, NOW))
    parser.close()
    assert [(c.name, c.arguments) for c in parser.calls] == [LISBON, NOW]


def test_no_grammar_without_a_call_to_force() -> None:
    assert tool_grammar(TOOLS, HERMES, "none", parallel=True) is None
    assert tool_grammar([], HERMES, "required", parallel=True) is None


def _format(kind: str, schema: dict[str, Any] | None = None) -> ResponseFormat:
    spec = None if schema is None else {"name": "out", "schema": schema, "strict": True}
    return ResponseFormat.model_validate({"type": kind, "json_schema": spec})


def test_response_formats(engine: Engine) -> None:
    assert response_format_grammar(None) is None
    assert response_format_grammar(_format("text")) is None
    anything = response_format_grammar(_format("json_object"))
    assert anything is not None and anything.kind == "json_schema"
    assert engine.accepts(anything, '{"any": [1, "thing"]}')
    assert not engine.accepts(anything, "[1]") and not engine.accepts(anything, "plain")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1}},
        "required": ["n"],
        "additionalProperties": False,
        "x-guidance": {"lenient": True},  # a client's engine options are replaced
    }
    strict = response_format_grammar(_format("json_schema", schema))
    assert strict is not None
    assert json.loads(strict.source)["x-guidance"]["whitespace_flexible"] is False
    assert engine.accepts(strict, '{"n": 3}')
    assert not engine.accepts(strict, '{"n": 0}') and not engine.accepts(strict, '{"n": 3, "m": 1}')
    assert not engine.accepts(strict, '{ "n": 3 }')
