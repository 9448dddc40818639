"""Grammars the grammar tests share, and the engine they run on (the tiny random model)."""

from __future__ import annotations

import json
from typing import Any

from engine import Engine
from engine.constraints import Grammar
from tests.engine._tiny_model import kv_bytes, tiny_model_dir

# Strict: nested objects, arrays, enums, required fields, string patterns, bounded lengths,
# additionalProperties false everywhere. Every value is bounded, so any path ends in < 200 tokens.
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {
            "type": "array",
            "items": {"enum": ["red", "green", "blue"]},
            "minItems": 1,
            "maxItems": 3,
        },
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 12},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "address", "active"],
    "additionalProperties": False,
}
PERSON_GRAMMAR = Grammar("json_schema", json.dumps(PERSON))


def tiny_engine(num_blocks: int = 512, block_size: int = 4, **overrides: Any) -> Engine:
    return Engine.from_pretrained(
        tiny_model_dir(),
        block_size=block_size,
        kv_cache_bytes=kv_bytes(num_blocks, block_size),
        device="cpu",
        dtype="float32",
        **overrides,
    )
