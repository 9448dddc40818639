"""Request shapes of tool calling and structured outputs (OpenAI Chat Completions).

Declared strictly (a number where a string belongs is a 400). What the shapes alone do not say
(a named ``tool_choice`` must name a declared tool, a ``tool`` message must answer an earlier
call, names are unique) is checked in gateway/chat/tools/checks.py.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# OpenAI's rule for function and response-format names.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
MAX_TOOLS = 128  # OpenAI's cap on the tools of one request

FunctionName = Annotated[str, Field(pattern=NAME_PATTERN)]


class _In(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class FunctionDef(_In):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        default=None, description="a JSON Schema object; absent: the function takes no arguments"
    )
    strict: bool | None = Field(default=None, description="accepted; calls are always enforced")

    @property
    def parameters_schema(self) -> dict[str, Any]:
        """The schema the arguments must match (OpenAI: absent means an empty parameter list)."""
        if self.parameters is None:
            return {"type": "object", "properties": {}, "additionalProperties": False}
        return self.parameters


class ToolDef(_In):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_In):
    name: FunctionName


class NamedToolChoice(_In):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(_In):
    name: str
    arguments: str  # JSON text, as the model wrote it (OpenAI passes it as a string)

    @property
    def arguments_value(self) -> Any:
        """The arguments as a JSON value for templates (HF templates expect a mapping); the text
        itself when it is not JSON."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


class ToolCallIn(_In):
    """A call of an earlier assistant turn, sent back in the conversation."""

    id: Annotated[str, Field(min_length=1, max_length=256)]
    type: Literal["function"]
    function: CalledFunction


class JsonSchemaSpec(_In):
    name: FunctionName
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = Field(default=None, description="accepted; the schema is always enforced")


class ResponseFormat(_In):
    """``{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}``."""

    type: str = Field(description='"text", "json_object" or "json_schema"')
    json_schema: JsonSchemaSpec | None = None
