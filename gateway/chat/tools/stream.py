"""The streamed answer of a request whose tools the gateway runs (gateway/chat/tools/loop.py).

    role chunk
    step 1 content deltas (calls are held back: a gateway-run call is never a client's delta)
    {"choices": [], "kvgate_tool_status": {"state": "running", "id", "name", "text"}}  per call
    {"choices": [], "kvgate_tool_status": {"state": "done", "id", "name", "status"}}   per call
    step 2 content deltas ...
    the client's calls (if any) as ``tool_calls`` deltas, the finish chunk
    {"choices": [], "kvgate_tool_runs": [...], "kvgate_steps": [...]}
    usage chunk (stream_options.include_usage), [DONE]

``text`` is the tool's ``status_text`` (the widget shows it while the tool runs; default
"Working..."). A failure once the stream is open is an error event, then [DONE]; so is a turn
that a refusal of a later step ended early (budget, TPM): its finish chunk ("length"), runs and
usage first, then the refusal as the terminal error event.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from gateway.chat.generation import ChoiceGroup
from gateway.chat.kept_turn import KeptTurn, turn_of
from gateway.chat.ledger import TOOL_CALLS
from gateway.chat.observe import RequestObserver
from gateway.chat.schemas import chunk_body, usage_body
from gateway.chat.sse import open_stream, send_done, send_event
from gateway.chat.tools.loop import RUNS_FIELD, STEPS_FIELD, Step, ToolLoop, step_of
from gateway.chat.tools.parser import ToolCall, ToolCallParser
from gateway.chat.tools.plan import OutputPlan
from gateway.chat.tools.run.runner import ToolRun
from gateway.errors import ApiError, to_api_error
from tenants.tools import TenantTool

STATUS_FIELD = "kvgate_tool_status"
DEFAULT_STATUS = "Working..."


class ToolStreamer:
    def __init__(
        self, loop: ToolLoop, resp: web.StreamResponse, rid: str, turn: KeptTurn | None = None
    ) -> None:
        self.loop = loop
        self.turn = turn  # the widget's kept turn: the content the visitor was sent
        self.resp = resp
        self.rid = rid
        self.created = int(time.time())
        self.model = loop.body.model

    def chunk(self, delta: dict[str, Any] | None, reason: str | None = None) -> dict[str, Any]:
        return chunk_body(self.rid, self.model, self.created, delta, reason)

    async def extension(self, **fields: Any) -> None:
        """A chunk with no choices carrying kvgate's own fields."""
        doc = self.chunk(None)
        doc.pop("usage", None)
        await send_event(self.resp, {**doc, **fields})

    async def step(self, gen: ChoiceGroup, plan: OutputPlan) -> Step:
        """Stream a started step's content; its calls are kept for the loop."""
        parser = ToolCallParser(plan.calls) if plan.calls is not None else None
        parts: list[str] = []
        reason = "stop"
        async with contextlib.aclosing(gen.pieces()) as pieces:
            async for piece in pieces:
                if piece.finish_reason is not None:
                    reason = piece.finish_reason
                    continue
                parts.append(piece.text)
                content = parser.feed(piece.text).content if parser else piece.text
                if content:
                    await self.content(content)
        if parser is None:
            return step_of(gen, "".join(parts), "".join(parts), reason, [])
        tail = parser.close().content
        if tail:
            await self.content(tail)
        return step_of(gen, parser.content, "".join(parts), reason, list(parser.calls))

    async def content(self, text: str) -> None:
        if self.turn is not None:
            self.turn.add(text)
        await send_event(self.resp, self.chunk({"content": text}))

    async def next_step(
        self, ids: list[int], plan: OutputPlan, round_: int, max_tokens: int
    ) -> Step:
        gen = self.loop.group(ids, plan, round_, max_tokens, streamed=True)
        try:
            await gen.start()
            return await self.step(gen, plan)
        finally:
            await gen.close()

    async def starting(self, tools: Sequence[TenantTool], calls: Sequence[ToolCall]) -> None:
        for tool, call in zip(tools, calls, strict=True):
            status = {"state": "running", "id": call.id, "name": call.name}
            await self.extension(
                **{STATUS_FIELD: {**status, "text": tool.status_text or DEFAULT_STATUS}}
            )

    async def finished(self, runs: Sequence[ToolRun]) -> None:
        for r in runs:
            status = {"state": "done", "id": r.call_id, "name": r.name, "status": r.status}
            await self.extension(**{STATUS_FIELD: status})

    async def end(self, calls: list[dict[str, Any]] | None, reason: str) -> None:
        if calls:
            deltas = [{"index": i, **c} for i, c in enumerate(calls)]
            await send_event(self.resp, self.chunk({"tool_calls": deltas}))
        await send_event(self.resp, self.chunk({}, reason))


async def stream(
    request: web.Request,
    loop: ToolLoop,
    gen: ChoiceGroup,
    rid: str,
    headers: dict[str, str],
    obs: RequestObserver,
) -> web.StreamResponse:
    resp = await open_stream(request, headers)
    out = ToolStreamer(loop, resp, rid, turn_of(request))
    await send_event(resp, out.chunk({"role": "assistant"}))
    try:
        outcome = await loop.drive(await out.step(gen, loop.ready.plan), out.next_step, out)
        gen.stats.finish_reason = outcome.finish_reason
        await out.end(outcome.tool_calls, outcome.finish_reason)
        await out.extension(**{RUNS_FIELD: outcome.runs, STEPS_FIELD: outcome.steps})
        s = gen.stats
        if loop.body.include_usage:
            usage = usage_body(s.prompt_tokens, s.completion_tokens, s.cached_tokens)
            await send_event(resp, chunk_body(rid, out.model, out.created, None, usage=usage))
        if outcome.error is not None:  # a later step was refused: the turn ended early
            raise outcome.error
        if out.turn is not None:  # the widget's history: kept before the stream ends
            await out.turn.save(out.model, s, rid)
    except ConnectionError:
        raise
    except Exception as exc:  # headers are out: an error event, then [DONE] (OpenAI style)
        err = exc if isinstance(exc, ApiError) else to_api_error(exc)
        if err is None:
            err = ApiError(500, "internal server error", type_="internal_error")
        obs.stream_error = err.code or err.type
        await send_event(resp, err.body())
    finally:
        request[TOOL_CALLS] = loop.calls_run  # the usage record's, however the turn ends
    await send_done(resp)
    obs.delivered = True
    await resp.write_eof()
    return resp
