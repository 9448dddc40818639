"""One engine request seen as text: token deltas -> text deltas, stop strings, final usage.

Stop strings are checked on decoded text. To never emit a stop string's beginning before knowing
whether it completes, the last ``max(len(stop)) - 1`` characters are held back::

    decoded so far:  | emitted ............ | held back (< longest stop) |
    a stop found at i: emit text[:i], finish "stop", abort the engine request at once
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from engine.model.tokenizer import IncrementalDetokenizer
from engine.outputs import RequestMetrics, RequestOutput
from engine.params import SamplingParams


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._buffer = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Text that is safe to emit now, and whether a stop string was reached."""
        buf = self._buffer + text
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._buffer = ""
            return buf[: min(hits)], True
        cut = max(0, len(buf) - self._hold)
        self._buffer = buf[cut:]
        return buf[:cut], False

    def flush(self) -> str:
        out, self._buffer = self._buffer, ""
        return out

    @property
    def active(self) -> bool:
        return bool(self._stops)


@dataclass
class GenerationStats:
    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    # time.monotonic() when the first text (``text``) or tokens (``full_text``) were ready
    first_token_at: float | None = None
    last_token_at: float | None = None
    engine_metrics: RequestMetrics | None = None


class Generation:
    """Runs one request through ``AsyncEngine.generate`` and yields text deltas.

    Leaving ``text()`` early (stop string, cancellation on client disconnect, an exception)
    closes the engine stream, which aborts the engine request and frees its blocks.
    """

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        namespace: str,
        request_id: str,
        stops: Sequence[str] = (),
    ) -> None:
        self._engine = engine
        self._tokenizer = tokenizer
        self._prompt_ids = prompt_ids
        self._params = params
        self._namespace = namespace
        self._request_id = request_id
        self._stops = StopMatcher(stops)
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        self._stream: AsyncIterator[RequestOutput] | None = None
        self._first: RequestOutput | None = None

    async def start(self) -> None:
        """Submit and wait for the first output, so admission errors (prompt too long, engine
        overloaded) surface before any response byte is sent."""
        self._stream = aiter(
            self._engine.generate(
                self._prompt_ids,
                self._params,
                namespace=self._namespace,
                request_id=self._request_id,
            )
        )
        self._first = await anext(self._stream)

    async def text(self) -> AsyncIterator[str]:
        assert self._stream is not None and self._first is not None, "start() first"
        detok = make_detokenizer(self._tokenizer)
        out: RequestOutput | None = self._first
        try:
            while out is not None:
                delta, stopped = self._consume(out, detok)
                if delta:
                    self._mark_token_time()
                    yield delta
                if stopped or out.finished:
                    break
                out = await anext(self._stream, None)
            tail = self._stops.flush() if self.stats.finish_reason != "stop_string" else ""
            if tail:
                self._mark_token_time()
                yield tail
        finally:
            await self.close()
        if self.stats.finish_reason == "stop_string":
            self.stats.finish_reason = "stop"

    async def full_text(self) -> str:
        """The whole completion, for a non-streaming answer.

        Without stop strings to watch, the tokens are detokenized once at the end instead of
        at every engine step: the same text (the incremental detokenizer only emits text that
        later tokens cannot change), and the per-step work on the event loop, which competes
        with the engine thread for the GIL while it computes the next step, is bookkeeping.
        """
        if self._stops.active:
            async with contextlib.aclosing(self.text()) as deltas:
                return "".join([delta async for delta in deltas])
        assert self._stream is not None and self._first is not None, "start() first"
        out: RequestOutput | None = self._first
        last = out
        try:
            while out is not None:
                last = out
                self._record(out)
                if out.new_token_ids:
                    self._mark_token_time()
                if out.finished:
                    break
                out = await anext(self._stream, None)
        finally:
            await self.close()
        detok = make_detokenizer(self._tokenizer)
        return detok.push(list(last.token_ids)) + detok.flush()

    def _record(self, out: RequestOutput) -> None:
        s = self.stats
        s.completion_tokens = len(out.token_ids)
        s.cached_tokens = out.num_cached_tokens
        s.engine_metrics = out.metrics
        if out.finished:
            s.finish_reason = "length" if out.finish_reason == "length" else "stop"

    def _consume(self, out: RequestOutput, detok: Any) -> tuple[str, bool]:
        self._record(out)
        text = detok.push(list(out.new_token_ids))
        if out.finished:
            text += detok.flush()
        delta, stopped = self._stops.feed(text)
        if stopped:
            self.stats.finish_reason = "stop_string"
        return delta, stopped

    def _mark_token_time(self) -> None:
        now = time.monotonic()
        if self.stats.first_token_at is None:
            self.stats.first_token_at = now
        self.stats.last_token_at = now

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None and hasattr(stream, "aclose"):
            await stream.aclose()  # engine: leaving early aborts the request


def make_detokenizer(tokenizer: Any) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(tokenizer)
