"""The answer of a request with tools: calls in ``message.tool_calls`` or ``delta.tool_calls``.

One ``ToolCallParser`` per choice reads the choice's text (gateway/chat/tools/parser.py). A
choice that called a function and ended by itself finishes with ``"tool_calls"``; one cut by
``max_tokens`` keeps ``"length"`` (its last call may be unfinished, as with OpenAI).

Streamed, each text piece becomes up to two deltas: its content, then its call deltas (a call's
first delta carries ``id``, ``type`` and the function's ``name``, later ones argument
fragments; consecutive fragments of one call are joined), the form the official SDK's stream
helpers assemble. A piece's logprobs go with its first delta, or with the next one when the
piece made none (text held back: a tag's beginning, whitespace).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.outputs import TokenLogprob
from gateway.chat.tools.formats import ToolFormat
from gateway.chat.tools.parser import CallDelta, Parsed, ToolCallParser


@dataclass(frozen=True)
class Completed:
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str


@dataclass(frozen=True)
class DeltaOut:
    delta: dict[str, Any]
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()


def finish_reason(reason: str, called: bool) -> str:
    return "tool_calls" if called and reason == "stop" else reason


def complete(fmt: ToolFormat, text: str, reason: str) -> Completed:
    parser = ToolCallParser(fmt)
    parser.feed(text)
    parser.close()
    calls = [c.body() for c in parser.calls] or None
    return Completed(parser.content, calls, finish_reason(reason, calls is not None))


class ToolStream:
    """The deltas of ``n`` streamed choices."""

    def __init__(self, fmt: ToolFormat, n: int) -> None:
        self._parsers = [ToolCallParser(fmt) for _ in range(n)]
        self._logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]

    def deltas(
        self,
        index: int,
        text: str,
        logprobs: Sequence[TokenLogprob],
        reason: str | None,
    ) -> list[DeltaOut]:
        parser = self._parsers[index]
        pending = self._logprobs[index]
        pending.extend(logprobs)
        parsed = parser.feed(text) if reason is None else parser.close()
        out = [DeltaOut(d) for d in _bodies(parsed)]
        if reason is not None:
            out.append(DeltaOut({}, finish_reason(reason, bool(parser.calls))))
        if out and pending:
            out[0] = DeltaOut(out[0].delta, out[0].finish_reason, tuple(pending))
            pending.clear()
        return out


def _bodies(parsed: Parsed) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if parsed.content:
        out.append({"content": parsed.content})
    if parsed.deltas:
        out.append({"tool_calls": [d.body() for d in _joined(parsed.deltas)]})
    return out


def _joined(deltas: Sequence[CallDelta]) -> list[CallDelta]:
    """Consecutive deltas of one call as one (its id and name kept from the first)."""
    out: list[CallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index and d.id is None:
            last = out[-1]
            out[-1] = CallDelta(last.index, last.arguments + d.arguments, last.id, last.name)
        else:
            out.append(d)
    return out
