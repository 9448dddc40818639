"""A request's grammar checked before admission: what the grammar engine cannot enforce is a 400.

``check_grammar`` (engine/runtime/grammar) compiles the grammar against the tokenizer (the
engine caches compiled grammars by digest, so the request's own compile is then a hit) and raises
``GrammarRejected`` naming the feature (``uniqueItems``, a look-around in a ``pattern``, ...).
A grammar not compiled yet is checked on the tokenize threads (gateway/prompts/tokenize_pool.py) as
a job of its own, keyed by its digest, so a tenant's concurrent requests with one new grammar wait
for one compile (a large schema compiles for milliseconds to seconds, never on the event loop);
then, with the prompt's rendering, the check is a lookup in the compile cache. A tool grammar
refused as a whole is narrowed down to the function whose parameters hold the feature, so the
error names ``tools[i].function.parameters``.
"""

from __future__ import annotations

import json
from typing import Any

from engine.constraints import Grammar
from engine.errors import GrammarRejected
from gateway.chat.tools.plan import OutputPlan
from gateway.errors import ApiError


def needs_compile(plan: OutputPlan, tokenizer: Any) -> bool:
    """Whether checking the plan's grammar may compile (a cold grammar: milliseconds to
    seconds, on the threads); a grammar compiled before is checked by a lookup, inline."""
    if plan.grammar is None:
        return False
    from engine.constraints.compiler import compiler_for

    return not compiler_for(tokenizer).is_cached(plan.grammar)


def check_plan(plan: OutputPlan, tokenizer: Any) -> None:
    if plan.grammar is None:
        return
    from engine.constraints.compiler import check_grammar

    try:
        check_grammar(plan.grammar, tokenizer)
    except GrammarRejected as exc:
        raise _culprit(plan, tokenizer, exc) from None


def _culprit(plan: OutputPlan, tokenizer: Any, whole: GrammarRejected) -> ApiError:
    """The refusal naming the field at fault: the first function whose parameters alone are
    refused, else the grammar's field."""
    from engine.constraints.compiler import check_grammar

    for i, tool in plan.tools:
        schema = json.dumps(tool.function.parameters_schema, ensure_ascii=False)
        try:
            check_grammar(Grammar("json_schema", schema), tokenizer)
        except GrammarRejected as own:
            return refusal(f"tools[{i}].function.parameters", own)
    param = plan.grammar_param
    if param == "response_format":
        param = "response_format.json_schema.schema"
    return refusal(param, whole)


def refusal(param: str, exc: GrammarRejected) -> ApiError:
    return ApiError(
        400,
        f"{param}: this schema cannot be enforced: {exc}",
        param=param,
        code="unsupported_schema",
    )
