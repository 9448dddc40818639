"""An output plan for an engine that enforces only some grammar kinds (vLLM: no Lark): tool
calls unforced under "auto", refused naming ``tool_choice`` when forced, schemas unchanged."""

from __future__ import annotations

import pytest

from engine.remote.vllm_wire import VLLM_GRAMMARS
from gateway.chat.tools.models import NamedToolChoice, ResponseFormat, ToolDef
from gateway.chat.tools.plan import for_engine, plan_output
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
def test_a_forced_call_is_refused_naming_tool_choice(choice: object) -> None:
    plan = plan_output([TOOL], choice, None, None, TEMPLATE)  # type: ignore[arg-type]
    with pytest.raises(ApiError) as err:
        for_engine(plan, VLLM_GRAMMARS, choice)  # type: ignore[arg-type]
    assert err.value.status == 400 and err.value.param == "tool_choice"


def test_a_json_schema_is_served_as_it_is() -> None:
    fmt = ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    )
    plan = plan_output([], None, None, fmt, TEMPLATE)
    assert for_engine(plan, VLLM_GRAMMARS, None) is plan
