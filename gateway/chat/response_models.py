"""Pydantic models of what ``POST /v1/chat/completions`` answers (for the OpenAPI document and
tests; the views build plain dicts with ``chat/schemas.py``'s builders, checked against these).

``ChatCompletion`` is the JSON answer, ``ChatCompletionChunk`` one SSE event of a stream (the
stream ends with ``data: [DONE]``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

FinishReason = Literal["stop", "length"]


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


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: str


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


class Delta(_Strict):
    role: Literal["assistant"] | None = None
    content: str | None = None


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
