"""Pydantic models of what ``POST /v1/chat/completions`` answers (for the OpenAPI document and
tests; the views build plain dicts with ``chat/schemas.py``'s builders, checked against these).

``ChatCompletion`` is the JSON answer, ``ChatCompletionChunk`` one SSE event of a stream (the
stream ends with ``data: [DONE]``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

FinishReason = Literal["stop", "length", "tool_calls"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TopLogprob(_Strict):
    token: str  # the token's text, or "bytes:\\xNN..." when not valid UTF-8 on its own
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(_Strict):
    content: list[TokenLogprobEntry] | None
    refusal: None = None


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(_Strict):
    id: str  # call_...
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_Strict):
    """``content`` is null when the answer is only tool calls; ``refusal`` is always null."""

    role: Literal["assistant"]
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


class Choice(_Strict):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None


class PromptTokensDetails(_Strict):
    cached_tokens: int


class Usage(_Strict):
    """The prompt is counted once, whatever ``n``; completion tokens of every choice."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ChatCompletion(_Strict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class FunctionDelta(_Strict):
    name: str | None = None  # on the call's first delta
    arguments: str  # the next fragment of the arguments' JSON text


class ToolCallDelta(_Strict):
    """One call's part of a chunk; ``id``, ``type`` and the name come on its first delta."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class Delta(_Strict):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(_Strict):
    index: int
    delta: Delta
    finish_reason: FinishReason | None
    logprobs: ChoiceLogprobs | None


class ChatCompletionChunk(_Strict):
    """One stream event: the role, text pieces of choice ``index`` (interleaved across choices),
    each choice's final chunk (empty delta, finish reason), then with ``include_usage`` a last
    chunk with ``choices: []`` and the usage."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
