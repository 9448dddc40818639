"""One streamed vLLM completion read into ``RequestOutput``s (no torch).

chunk with tokens       -> an output with them as the delta (logprobs beside)
chunk with finish       -> held until the usage chunk (``cached_tokens``) or [DONE]
usage chunk / [DONE]    -> the final output
aborted by the caller   -> a final "abort" output with what was generated
error chunk, or the connection gone before the end
                        -> WorkerUnavailable before the first output, WorkerLost after
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp

from engine.errors import EngineDead, EngineError, GrammarRejected, PromptTooLong, RequestRejected
from engine.outputs import FinishReason, RequestMetrics, RequestOutput, TokenLogprob
from engine.remote.client import WorkerLost, WorkerUnavailable
from engine.remote.vllm_wire import Chunk, ChunkError, parse_chunk

DONE = b"[DONE]"


class StreamState:
    def __init__(self, request_id: str, num_prompt_tokens: int, top_k: int | None) -> None:
        self._rid = request_id
        self._n_prompt = num_prompt_tokens
        self._top_k = top_k
        self._tokens: list[int] = []
        self._arrival = time.monotonic()
        self._first: float | None = None
        self._finish: FinishReason | None = None
        self._cached = 0
        self.delivered = False

    async def read(
        self, resp: aiohttp.ClientResponse, aborted: asyncio.Event
    ) -> AsyncIterator[RequestOutput]:
        try:
            async for chunk in _chunks(resp, self._top_k):
                if chunk.error is not None:
                    raise self.broken(f"vLLM: {chunk.error}")
                if chunk.usage is not None:
                    self._cached = chunk.usage.cached_tokens
                    self._finish = self._finish or "stop"
                    yield self._output((), None, self._finish)
                    return
                self._finish = chunk.finish_reason or self._finish
                if chunk.token_ids:
                    yield self._output(chunk.token_ids, chunk.logprobs, None)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            if not aborted.is_set():
                raise self.broken(f"vLLM stream broke: {type(exc).__name__}") from None
        if aborted.is_set():
            yield self._output((), None, "abort")
        elif self._finish is not None:
            yield self._output((), None, self._finish)
        else:
            raise self.broken("vLLM stream ended before the request finished")

    def broken(self, why: str) -> EngineDead:
        return WorkerLost(why) if self.delivered else WorkerUnavailable(why)

    def _output(
        self,
        new: tuple[int, ...],
        logprobs: tuple[TokenLogprob, ...] | None,
        finish: FinishReason | None,
    ) -> RequestOutput:
        now = time.monotonic()
        if new and self._first is None:
            self._first = now
        self._tokens.extend(new)
        self.delivered = True
        metrics = RequestMetrics(
            arrival_time=self._arrival,
            first_token_time=self._first,
            finish_time=now if finish is not None else None,
        )
        return RequestOutput(
            request_id=self._rid,
            num_prompt_tokens=self._n_prompt,
            token_ids=tuple(self._tokens),
            new_token_ids=new,
            num_cached_tokens=self._cached,
            finished=finish is not None,
            finish_reason=finish,
            metrics=metrics,
            new_logprobs=logprobs if logprobs is not None or self._top_k is None else (),
        )


async def _chunks(resp: aiohttp.ClientResponse, top_k: int | None) -> AsyncIterator[Chunk]:
    """The stream's ``data:`` events, parsed; ends at [DONE] or when the connection ends."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == DONE:
            return
        try:
            yield parse_chunk(json.loads(data), top_k)
        except (ValueError, ChunkError) as exc:
            yield Chunk(error=f"unreadable chunk: {exc}")


def rejection(text: str, structured: bool) -> EngineError:
    """The engine error of a vLLM 400: the prompt too long, the structured output refused, or
    the request otherwise invalid (vLLM's message)."""
    try:
        body = json.loads(text)
        message = str(body.get("error", {}).get("message") or body.get("message") or text)
    except (ValueError, AttributeError):
        message = text
    lower = message.lower()
    if "context length" in lower or "maximum model length" in lower or "too long" in lower:
        return PromptTooLong(f"vLLM: {message}")
    if structured and any(w in lower for w in ("grammar", "schema", "structured", "json")):
        return GrammarRejected(f"vLLM: {message}")
    return RequestRejected(f"vLLM: {message}")
