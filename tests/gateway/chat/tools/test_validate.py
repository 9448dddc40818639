"""The grammar check before admission (the grammar engine's own ``check_grammar``): refusals name
the field at fault, and a grammar compiled once is checked inline after that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.text.tokenizer import Tokenizer
from gateway.chat.tools.models import NamedToolChoice, ResponseFormat, ToolDef
from gateway.chat.tools.plan import OutputPlan, plan_output
from gateway.chat.tools.validate import check_plan, needs_compile
from gateway.errors import ApiError


def _tool(name: str, parameters: dict[str, Any]) -> ToolDef:
    return ToolDef.model_validate(
        {"type": "function", "function": {"name": name, "parameters": parameters}}
    )


GOOD = _tool("good", {"type": "object", "properties": {"n": {"type": "integer"}}})
BAD = _tool("bad", {"type": "object", "properties": {"s": {"not": {"type": "string"}}}})


@pytest.fixture(scope="module")
def tok(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(demo_model_dir)


def _plan(tok: Tokenizer, tools: list[ToolDef], choice: Any = None, fmt: Any = None) -> OutputPlan:
    rf = None if fmt is None else ResponseFormat.model_validate(fmt)
    return plan_output(tools, choice, None, rf, tok.chat_template)


def test_refusals_name_the_field(tok: Tokenizer) -> None:
    cases = [
        (_plan(tok, [GOOD, BAD]), "tools[1].function.parameters"),
        (
            _plan(
                tok,
                [BAD, GOOD],
                NamedToolChoice.model_validate({"type": "function", "function": {"name": "bad"}}),
            ),
            "tools[0].function.parameters",
        ),
        (
            _plan(
                tok,
                [],
                fmt={"type": "json_schema", "json_schema": {"name": "o", "schema": {"not": {}}}},
            ),
            "response_format.json_schema.schema",
        ),
    ]
    for plan, param in cases:
        with pytest.raises(ApiError) as info:
            check_plan(plan, tok)
        assert (info.value.status, info.value.param, info.value.code) == (
            400,
            param,
            "unsupported_schema",
        )
        assert "not" in info.value.message


def test_a_compiled_grammar_is_checked_inline(tok: Tokenizer) -> None:
    plan = _plan(
        tok, [_tool("fresh_one", {"type": "object", "properties": {"q": {"type": "boolean"}}})]
    )
    assert needs_compile(plan, tok)
    check_plan(plan, tok)
    assert not needs_compile(plan, tok)
    assert not needs_compile(_plan(tok, []), tok)  # no grammar: nothing to compile
    with pytest.raises(ApiError):  # a refusal is remembered as well
        check_plan(_plan(tok, [BAD]), tok)
    assert not needs_compile(_plan(tok, [BAD]), tok)
