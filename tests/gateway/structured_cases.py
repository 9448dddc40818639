"""Schemathesis cases of the chat operation with tools and structured outputs.

Cases generated from the document alone rarely hold a valid tool list (names must match a
pattern, a named choice must name one of them) and a body the rest of the checks let through,
so this part draws whole bodies: ``tools`` (small schemas, one the grammar engine cannot
enforce), each ``tool_choice``, ``parallel_tool_calls``, ``response_format``, streamed or not,
and tool turns in the conversation. Each answer is checked against the document like every other
case; the calls answered (JSON ``tool_calls`` or streamed ``delta.tool_calls``) are counted.
"""

from __future__ import annotations

from typing import Any

import hypothesis
import hypothesis.strategies as st
from schemathesis import Case

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {}, "additionalProperties": False},
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    },
    {"type": "object", "properties": {"tag": {"enum": ["a", "b"]}}, "required": ["tag"]},
    {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}},  # a 400
]
NAMES = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)


@st.composite
def structured(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    tools = [
        {"type": "function", "function": {"name": n, "parameters": draw(st.sampled_from(SCHEMAS))}}
        for n in names
    ]
    choice = draw(
        st.sampled_from(
            ["none", "auto", "required", {"type": "function", "function": {"name": names[0]}}]
        )
    )
    fields: dict[str, Any] = {"tools": tools, "tool_choice": choice}
    fields["parallel_tool_calls"] = draw(st.booleans())
    if choice == "none" and draw(st.booleans()):
        schema = draw(st.sampled_from(SCHEMAS))
        fmt = draw(
            st.sampled_from(
                [
                    {"type": "json_object"},
                    {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}},
                ]
            )
        )
        fields["response_format"] = fmt
    if draw(st.booleans()):
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": names[0], "arguments": "{}"},
        }
        fields["messages"] = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        ]
    fields["stream"] = draw(st.booleans())
    return fields


def run_structured(schema: Any, suite: Any, examples: int, key: str) -> int:
    """Send ``examples`` structured chat cases with tenant ``key``; the calls answered."""
    operation = next(
        r.ok() for r in schema.get_all_operations() if r.ok().path == "/v1/chat/completions"
    )
    called = [0]

    def case_of(fields: dict[str, Any]) -> Case:
        msgs = [{"role": "user", "content": "hi"}]
        body = {"model": suite.model, "messages": msgs, "max_tokens": 48, "seed": 1, **fields}
        return operation.Case(body=body, media_type="application/json")

    saved, suite.tenant_key = suite.tenant_key, key

    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(case=structured().map(case_of))
    def run(case: Case) -> None:
        suite.authorize(case)
        response = case.call(base_url=suite.base_url, session=suite.http)
        suite.validate(case, response)
        if response.status_code == 200 and '"tool_calls"' in response.text:
            called[0] += 1

    try:
        run()
    finally:
        suite.tenant_key = saved
    return called[0]
