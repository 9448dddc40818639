"""Grammars for tool calls and structured outputs (engine/constraints.py ``Grammar``).

Tool calls are Lark grammars in the grammar engine's dialect (llguidance: ``%json {...}`` embeds
a JSON schema, ``[lazy]`` ends a lexeme at its first match). Per ``tool_choice``::

    required   start: call (SEP call)*            one call or more (one: parallel_tool_calls false)
    named      start: call                        exactly one call, of that function
    auto       start: TEXT | pre rest             free text; once the model writes the opening tag
               pre[lazy]: TEXT OPEN               the call is forced from there on (lazy lexeme:
                                                  the text ends at the first OPEN)
    none       no grammar

A call is the family's wrapping (gateway/chat/tools/formats.py) around one JSON schema: an
object ``{"name": const, "<args>": parameters}`` (an ``anyOf`` of them for several functions),
or for SmolLM2 an array of them. Llama 3's calls have no tag: with ``auto`` an answer starting
with ``{`` is a call, any other is text. The calls are written with the separators the
families were trained on (``", "``, ``": "``) and no other whitespace.

Each function's parameters are embedded under ``$defs/t<i>`` with its local ``$ref``s rewritten
to point there, so schemas with ``$defs`` (pydantic models) keep resolving inside the call
schema. ``response_format`` is a ``json_schema`` grammar of the schema itself (``json_object``:
any object), spelled the same way; a client's own ``x-guidance`` (the grammar engine's options,
``lenient`` among them) is replaced, so no schema feature is silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.constraints import Grammar
from gateway.chat.tools.formats import ToolFormat
from gateway.chat.tools.models import ResponseFormat, ToolDef

# One spelling per value: no free whitespace, json.dumps' separators (as the families write
# calls, and as the engine compiles JSON schemas by default).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Keywords whose values are data, not schemas: a "$ref" inside them is not a reference.
_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
# Keywords whose values map any names (a property may be called "enum") to schemas.
_SCHEMA_MAPS = frozenset(
    ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
)


def response_format_grammar(fmt: ResponseFormat | None) -> Grammar | None:
    if fmt is None or fmt.type == "text":
        return None
    spec = fmt.json_schema
    schema = spec.schema_ if spec is not None and spec.schema_ is not None else None
    root: dict[str, object] = dict(schema) if schema is not None else {"type": "object"}
    root["x-guidance"] = JSON_OPTIONS  # ours: a client's options never loosen the schema
    return Grammar("json_schema", json.dumps(root, ensure_ascii=False))


def tool_grammar(
    tools: Sequence[ToolDef], fmt: ToolFormat, mode: str, parallel: bool
) -> Grammar | None:
    """``mode``: "auto", "required", or "named" (``tools`` is then the named function)."""
    if mode not in ("auto", "required", "named") or not tools:
        return None
    many = parallel and mode != "named"
    body = calls_schema(tools, fmt, many=many, empty=mode == "auto")
    lines = ["%llguidance {}", f"body: %json {json.dumps(body, ensure_ascii=False)}"]
    lines += _rules(fmt, mode, many)
    return Grammar("lark", "\n".join(lines) + "\n")


def forced_call_schema(tools: Sequence[ToolDef], fmt: ToolFormat, many: bool) -> Grammar:
    """A forced call as a JSON schema, for engines without the Lark dialect (vLLM): what one
    call block holds, its opening already in the prompt (``ToolFormat.primed``). One call, or
    for array formats as many as ``many`` allows."""
    body = calls_schema(tools, fmt, many=many and fmt.array, empty=False)
    return Grammar("json_schema", json.dumps(body, ensure_ascii=False))


def _rules(fmt: ToolFormat, mode: str, many: bool) -> list[str]:
    more = " (sep call)*" if many and not fmt.array else ""
    if fmt.open is None:  # llama3: bare objects, separated
        rules = [f"call: body{more}", f"sep: {_lit(fmt.separator)}"]
        start = "start: TEXT | call" if mode == "auto" else "start: call"
        return [start, *rules, r"TEXT: /[^{](.|\n)*/"]
    assert fmt.close is not None
    rest = (
        f"{_lit(fmt.pad)} body {_lit(fmt.pad + fmt.close)}"
        if fmt.pad
        else f"body {_lit(fmt.close)}"
    )
    rules = [
        f"call: {_lit(fmt.open)} {rest}",
        f"sep: {_lit(fmt.separator)}" if fmt.separator else "",
    ]
    if mode == "auto":
        lazy = [f"start: TEXT | pre {rest}{more}", f"pre[lazy]: TEXT {_lit(fmt.open)}"]
        return [*lazy, *filter(None, rules), r"TEXT: /(.|\n)*/"]
    return [f"start: call{more}", *filter(None, rules)]


def _lit(text: str) -> str:
    return json.dumps(text)


def calls_schema(
    tools: Sequence[ToolDef], fmt: ToolFormat, *, many: bool, empty: bool
) -> dict[str, Any]:
    """The JSON schema of what one call block holds: one call object (an ``anyOf`` of the
    functions), or for array formats the list of calls (at least one unless ``empty``, at most
    one unless ``many``)."""
    defs = {
        f"t{i}": _rebase(t.function.parameters_schema, f"#/$defs/t{i}") for i, t in enumerate(tools)
    }
    objects = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                fmt.args_key: {"$ref": f"#/$defs/t{i}"},
            },
            "required": ["name", fmt.args_key],
            "additionalProperties": False,
        }
        for i, t in enumerate(tools)
    ]
    call: dict[str, Any] = objects[0] if len(objects) == 1 else {"anyOf": objects}
    if fmt.array:
        call = {"type": "array", "items": call, "minItems": 0 if empty else 1}
        if not many:
            call["maxItems"] = 1
    return {**call, "$defs": defs, "x-guidance": JSON_OPTIONS}


def _rebase(node: Any, base: str) -> Any:
    """A copy of a schema with its local references (``#...``) moved under ``base``."""
    if isinstance(node, list):
        return [_rebase(item, base) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        elif key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _rebase(sub, base) for name, sub in value.items()}
        else:
            out[key] = _rebase(value, base)
    return out
