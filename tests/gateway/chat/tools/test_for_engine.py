"""An output plan for an engine that enforces only some grammar kinds (vLLM: no Lark): tool
calls unforced under "auto"; forced ones primed (the call block's opening in the prompt, a JSON
schema for the call) where JSON schemas are enforced, else refused naming ``tool_choice``;
response schemas unchanged. Live: tests/gateway/chat/tools/test_primed_calls.py."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import pytest

from engine.remote.vllm_wire import VLLM_GRAMMARS
from gateway.chat.tools.formats import HERMES, SMOLLM2, ToolFormat
from gateway.chat.tools.models import NamedToolChoice, ResponseFormat, ToolDef
from gateway.chat.tools.parser import ToolCallParser
from gateway.chat.tools.plan import OutputPlan, for_engine, plan_output
from gateway.errors import ApiError

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
TOOL = ToolDef.model_validate(
    {"type": "function", "function": {"name": "hours", "parameters": {"type": "object"}}}
)


def test_auto_tools_are_served_without_a_grammar_and_still_parsed() -> None:
    plan = plan_output([TOOL], "auto", None, None, TEMPLATE)
    assert plan.grammar is not None and plan.grammar.kind == "lark"
    served = for_engine(plan, VLLM_GRAMMARS, "auto")
    assert served.grammar is None and served.calls == plan.calls
    assert for_engine(plan, frozenset({"lark"}), "auto") is plan  # kvgate's engine: unchanged


@pytest.mark.parametrize(
    "choice",
    [
        "required",
        NamedToolChoice.model_validate({"type": "function", "function": {"name": "hours"}}),
    ],
)
def test_a_forced_call_is_refused_without_json_schemas(choice: object) -> None:
    plan = plan_output([TOOL], choice, None, None, TEMPLATE)  # type: ignore[arg-type]
    with pytest.raises(ApiError) as err:
        for_engine(plan, frozenset({"regex"}), choice)  # type: ignore[arg-type]
    assert err.value.status == 400 and err.value.param == "tool_choice"


def test_a_json_schema_is_served_as_it_is() -> None:
    fmt = ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    )
    plan = plan_output([], None, None, fmt, TEMPLATE)
    assert for_engine(plan, VLLM_GRAMMARS, None) is plan


HOURS = ToolDef.model_validate(
    {
        "type": "function",
        "function": {
            "name": "hours",
            "parameters": {
                "type": "object",
                "properties": {"day": {"type": "string"}},
                "required": ["day"],
            },
        },
    }
)
CLOSE = ToolDef.model_validate(
    {"type": "function", "function": {"name": "close", "parameters": {"type": "object"}}}
)
CALL = {"name": "hours", "arguments": {"day": "Monday"}}


# A template of each family (gateway/chat/tools/formats.py reads the family from its source).
FAMILY = {
    "hermes": TEMPLATE,
    "smollm2": "{# SmolLM #}" + TEMPLATE,
    "llama3": TEMPLATE + "<|eot_id|>",
}


def _primed(choice: object, family: str, parallel: bool | None = None) -> OutputPlan:
    plan = plan_output([HOURS, CLOSE], choice, parallel, None, FAMILY[family])  # type: ignore[arg-type]
    assert plan.fmt.name == family and plan.grammar is not None and plan.grammar.kind == "lark"
    served = for_engine(plan, VLLM_GRAMMARS, choice, parallel)  # type: ignore[arg-type]
    assert served.grammar is not None and served.grammar.kind == "json_schema"
    return served


def _valid(plan: OutputPlan, doc: object) -> bool:
    assert plan.grammar is not None
    schema = json.loads(plan.grammar.source)
    return jsonschema.Draft202012Validator(schema).is_valid(doc)


def test_required_is_primed_with_the_blocks_opening_and_a_call_schema() -> None:
    plan = _primed("required", "hermes")
    assert plan.calls is not None and plan.calls.primed
    assert (plan.primer, plan.closer) == ("<tool_call>\n", "\n</tool_call>")
    assert _valid(plan, CALL) and _valid(plan, {"name": "close", "arguments": {}})
    assert not _valid(plan, {"name": "open", "arguments": {}})
    assert not _valid(plan, {"name": "hours", "arguments": {}})  # its required "day"
    assert not _valid(plan, [CALL])  # one call a block


def test_a_named_function_is_the_only_one_the_schema_takes() -> None:
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "close"}})
    plan = _primed(named, "hermes")
    assert _valid(plan, {"name": "close", "arguments": {}}) and not _valid(plan, CALL)


def test_array_blocks_hold_as_many_calls_as_parallel_tool_calls_allows() -> None:
    many, one = _primed("required", "smollm2"), _primed("required", "smollm2", parallel=False)
    assert many.primer == "<tool_call>" and many.closer == "</tool_call>"
    assert _valid(many, [CALL, CALL]) and not _valid(many, [])
    assert _valid(one, [CALL]) and not _valid(one, [CALL, CALL])


def test_llama3_calls_need_no_opening() -> None:
    plan = _primed("required", "llama3")
    assert plan.calls is not None and not plan.calls.primed and plan.primer == ""
    assert _valid(plan, {"name": "hours", "parameters": {"day": "Monday"}})


@pytest.mark.parametrize("fmt", [HERMES, SMOLLM2])
def test_the_parser_of_a_primed_answer_reads_the_json_alone(fmt: ToolFormat) -> None:
    body = json.dumps([CALL] if fmt.array else CALL)
    parser = ToolCallParser(replace(fmt, primed=True))
    parser.feed(body[:9])
    parser.feed(body[9:])
    parser.close()
    (call,) = parser.calls
    assert (call.name, json.loads(call.arguments), call.complete) == (
        "hours",
        CALL["arguments"],
        True,
    )
    assert parser.content is None
    cut = ToolCallParser(replace(fmt, primed=True))
    cut.feed(body[:-4])
    cut.close()
    assert not any(c.complete for c in cut.calls)  # a cut call never runs
