"""One engine request seen as text: token deltas -> text deltas, stop strings, final usage.

Stop strings are checked on decoded text, incrementally (``stops.StopMatcher``: the tail that
may begin a stop string is held back); a stop found ends the choice ("stop") and aborts its
engine request at once.

Logprobs (when asked) travel with the text: each emitted piece carries the entries of the tokens
consumed since the previous piece. The token that ended a request in the engine (EOS or a stop
token) is not part of the answer, so its entry is dropped, as OpenAI does; the last token of a
request whose grammar completed is (the grammar ends it without an EOS), and keeps its entry.
A streamed choice keeps only the entries not yet sent; a non-streamed one keeps them all for the
answer (bounded per request: gateway/chat/bounds.py).

``n`` choices of one prompt (``ChoiceGroup``) are ``n`` ordinary engine requests in the same
namespace and cache scope (one end user), submitted together: the prefix cache gives them the
prompt's blocks once (early reuse joins blocks still being computed), and a streamed answer
interleaves their pieces by index.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

from engine.api import EngineClient, GenerateOptions
from engine.outputs import RequestMetrics, RequestOutput, TokenLogprob
from engine.params import SamplingParams
from engine.text.tokenizer import IncrementalDetokenizer, Tokenizer
from gateway.chat.stops import StopMatcher

# How long a request that did not finish (the client went away, the handler failed) waits for the
# engine's final output after asking it to abort: that output counts every token generated until
# the abort, which usage, the ledger and budgets bill. An abort lands between engine steps.
ABORT_WAIT_S = 5.0


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
    worker: str | None = None  # the engine worker that served it (None: the in-process engine)


@dataclass(frozen=True)
class Piece:
    """A streamed part of one choice: new text, the logprobs of the tokens behind it (empty
    unless asked), and on the choice's last piece its finish reason."""

    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None


@dataclass(frozen=True)
class ChoiceResult:
    index: int
    text: str
    finish_reason: str
    logprobs: tuple[TokenLogprob, ...] | None  # None when not asked


class Generation:
    """Runs one request through ``EngineClient.generate`` and yields text deltas.

    Leaving ``text()`` early (stop string, cancellation on client disconnect, an exception)
    closes the engine stream, which aborts the engine request and frees its blocks. Outputs are
    awaited through a shield, so a cancelled caller leaves the engine stream readable: ``close``
    asks the engine to abort a request that has not finished and reads its final output, whose
    tokens (all generated until the abort) are what ``stats`` then bill.
    """

    def __init__(
        self,
        engine: EngineClient,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        options: GenerateOptions,
        *,
        stops: Sequence[str] = (),
        index: int = 0,
        on_update: Callable[[Generation], None] | None = None,
        keep_logprobs: bool = True,
    ) -> None:
        self.index = index
        # interim=False: a non-streaming answer without stop strings needs the first output
        # (admission, time to first token) and the final one only; the engine skips the rest.
        if stops and not options.interim:
            options = dataclasses.replace(options, interim=True)
        self._options = options
        self._on_update = on_update  # told after every change of ``stats``
        self._engine = engine
        self._tokenizer = tokenizer
        self._prompt_ids = prompt_ids
        self._params = params
        self._stops = StopMatcher(stops)
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        self.token_ids: Sequence[int] = ()  # the answer's tokens so far (the tool loop's)
        self._stream: AsyncGenerator[RequestOutput, None] | None = None
        self._next: asyncio.Future[RequestOutput | None] | None = None  # the output awaited
        self._ended = False  # the engine sent the final output (or the stream failed)
        self._first: RequestOutput | None = None
        # Entries of the answer's tokens, if asked: ``logprobs`` all of them (non-streamed
        # answers only: ``keep_logprobs``), ``_unsent`` those not yet attached to a piece.
        self._keep_logprobs = keep_logprobs
        self.logprobs: list[TokenLogprob] = []
        self._unsent: list[TokenLogprob] = []

    async def start(self) -> None:
        """Submit and wait for the first output, so admission errors (prompt too long, engine
        overloaded) surface before any response byte is sent."""
        self._stream = self._engine.generate(self._prompt_ids, self._params, self._options)
        first = await self._pull()
        assert first is not None, "an engine stream starts with an output"
        self._first = first
        self.stats.worker = self._first.worker
        if self._on_update is not None:
            self._on_update(self)

    async def text(self) -> AsyncGenerator[str, None]:
        async with contextlib.aclosing(self.pieces()) as pieces:
            async for piece in pieces:
                if piece.text:
                    yield piece.text

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        """Text deltas with their logprobs; the last piece carries the finish reason."""
        assert self._stream is not None and self._first is not None, "start() first"
        detok = make_detokenizer(self._tokenizer)
        out: RequestOutput | None = self._first
        try:
            while out is not None:
                delta, stopped = self._consume(out, detok)
                if delta:
                    self._mark_token_time()
                    yield Piece(self.index, delta, self._take_logprobs())
                if stopped or out.finished:
                    break
                out = await self._pull()
            tail = self._stops.flush() if self.stats.finish_reason != "stop_string" else ""
            if tail:
                self._mark_token_time()
            if tail or self._unsent:
                yield Piece(self.index, tail, self._take_logprobs())
        finally:
            await self.close()
        if self.stats.finish_reason == "stop_string":
            self.stats.finish_reason = "stop"
            if self._on_update is not None:
                self._on_update(self)
        yield Piece(self.index, "", (), self.stats.finish_reason or "stop")

    def _take_logprobs(self) -> tuple[TokenLogprob, ...]:
        if not self._unsent:
            return ()
        taken = tuple(self._unsent)
        self._unsent.clear()
        return taken

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
        last: RequestOutput = self._first
        try:
            while out is not None:
                last = out
                self._record(out)
                if out.new_token_ids:
                    self._mark_token_time()
                if out.finished:
                    break
                out = await self._pull()
        finally:
            await self.close()
        detok = make_detokenizer(self._tokenizer)
        return detok.push(list(last.token_ids)) + detok.flush()

    def _record(self, out: RequestOutput, *, aborted: bool = False) -> None:
        """Take ``out`` into the stats; ``aborted``: the final output of an abort this
        generation asked for (counted, but the finish reason is the caller's to say)."""
        s = self.stats
        self.token_ids = out.token_ids
        s.completion_tokens = len(out.token_ids)
        s.cached_tokens = out.num_cached_tokens
        s.engine_metrics = out.metrics
        if out.finished and not aborted:
            s.finish_reason = "length" if out.finish_reason == "length" else "stop"
        if out.new_logprobs:
            entries = out.new_logprobs
            if out.finished and out.finish_reason == "stop" and self._ended_by_stop_token(out):
                entries = entries[:-1]  # the EOS / stop token is not part of the answer
            if self._keep_logprobs:
                self.logprobs.extend(entries)
            self._unsent.extend(entries)
        if self._on_update is not None:
            self._on_update(self)

    def _ended_by_stop_token(self, out: RequestOutput) -> bool:
        """Whether the last token is an EOS or stop token (not part of the answer); a request
        whose grammar completed ends with an ordinary token instead (finish "stop" as well)."""
        last = out.token_ids[-1] if out.token_ids else None
        return last in self._tokenizer.eos_token_ids or last in self._params.stop_token_ids

    def _consume(self, out: RequestOutput, detok: IncrementalDetokenizer) -> tuple[str, bool]:
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
        if self._on_update is not None:
            self._on_update(self)

    async def _pull(self) -> RequestOutput | None:
        """The stream's next output (None: it ended). The wait is shielded: cancelling the
        caller leaves the pending read in place for ``close``."""
        assert self._stream is not None, "start() first"
        if self._next is None:
            self._next = asyncio.ensure_future(anext(self._stream, None))
        pending = self._next
        try:
            out = await asyncio.shield(pending)
        except asyncio.CancelledError:
            if pending.cancelled():
                self._next = None
            raise
        except BaseException:
            self._next, self._ended = None, True  # the stream raised: it is over
            raise
        self._next = None
        if out is None or out.finished:
            self._ended = True
        return out

    async def close(self) -> None:
        """Release the engine request. One that has not finished is aborted first and its final
        output read (within ``ABORT_WAIT_S``), so ``stats`` count what the engine generated."""
        if self._stream is None:
            return
        try:
            if not self._ended and self._options.request_id is not None:
                await self._settle(self._options.request_id)
        finally:
            stream, self._stream = self._stream, None
            pending, self._next = self._next, None
            if pending is not None and not pending.done():
                pending.cancel()  # the engine stream's own clean-up aborts the request
                await asyncio.wait([pending])
            if stream is not None:
                await stream.aclose()

    async def _settle(self, request_id: str) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(ABORT_WAIT_S):
                await self._engine.abort(request_id)
                while not self._ended:
                    out = await self._pull()
                    if out is not None:
                        self._record(out, aborted=True)


def make_detokenizer(tokenizer: Tokenizer) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(tokenizer)


class ChoiceGroup:
    """``n`` choices of one prompt, each its own engine request through ``engine.generate``.

    ``stats`` sums the choices: the prompt is counted once (as OpenAI bills it), completion
    tokens of every choice; cached tokens, finish reason, engine timings and worker are choice 0's.
    Choice ``i`` samples with ``seed + i`` when a seed is given.
    """

    def __init__(
        self,
        engine: EngineClient,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        options: GenerateOptions,
        *,
        n: int,
        stops: Sequence[str] = (),
        streamed: bool = True,
    ) -> None:
        """``options.request_id`` names choice 0; choice ``i`` is ``<id>-i``. A non-streamed
        answer asks the engine for no interim outputs."""
        self.tokenizer = tokenizer
        # One choice is the whole group: its stats are the group's, with no per-token summing.
        on_update = self._refresh if n > 1 else None
        rid = options.request_id
        assert rid is not None, "a choice group names its requests"
        base = dataclasses.replace(options, interim=streamed)
        self.choices = [
            Generation(
                engine,
                tokenizer,
                prompt_ids,
                choice_params(params, i),
                dataclasses.replace(base, request_id=rid if i == 0 else f"{rid}-{i}"),
                stops=stops,
                index=i,
                on_update=on_update,
                keep_logprobs=not streamed,  # a stream sends each entry once, then drops it
            )
            for i in range(n)
        ]
        self._counted = [0] * n  # completion tokens of each choice already in ``stats``
        self.stats = (
            GenerationStats(prompt_tokens=len(prompt_ids)) if n > 1 else self.choices[0].stats
        )
        self.wants_logprobs = params.logprobs is not None

    def _refresh(self, choice: Generation) -> None:
        """Fold one choice's change into the sums in O(1) (every choice reports every step:
        recomputing over all n choices each time would cost O(n^2) per engine step). Exact
        because a choice's completion tokens only grow, its first token time is set once and
        its last token time only moves forward."""
        s, c = self.stats, choice.stats
        s.completion_tokens += c.completion_tokens - self._counted[choice.index]
        self._counted[choice.index] = c.completion_tokens
        if choice.index == 0:
            s.cached_tokens = c.cached_tokens
            s.finish_reason = c.finish_reason
            s.engine_metrics = c.engine_metrics
            s.worker = c.worker
        if c.first_token_at is not None and (
            s.first_token_at is None or c.first_token_at < s.first_token_at
        ):
            s.first_token_at = c.first_token_at
        if c.last_token_at is not None and (
            s.last_token_at is None or c.last_token_at > s.last_token_at
        ):
            s.last_token_at = c.last_token_at

    async def start(self) -> None:
        """Submit every choice at once (one engine step can admit them all) and wait for each
        first output; if one fails, the others are stopped and the error is raised."""
        if len(self.choices) == 1:
            await self.choices[0].start()
            return
        tasks = [asyncio.ensure_future(c.start()) for c in self.choices]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def results(self) -> list[ChoiceResult]:
        """Every choice in full (non-streaming answer)."""
        out = []
        for c in self.choices:
            text = await c.full_text()
            logprobs = tuple(c.logprobs) if self.wants_logprobs else None
            out.append(ChoiceResult(c.index, text, c.stats.finish_reason or "stop", logprobs))
        return out

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        """Pieces of all choices in the order they are ready (one choice: its own order)."""
        if len(self.choices) == 1:
            async with contextlib.aclosing(self.choices[0].pieces()) as pieces:
                async for piece in pieces:
                    yield piece
            return
        streams = [c.pieces() for c in self.choices]
        pending = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: pending[f]):
                    i = pending.pop(fut)
                    try:
                        piece = fut.result()
                    except StopAsyncIteration:
                        continue
                    yield piece
                    pending[asyncio.ensure_future(anext(streams[i]))] = i
        finally:
            for fut in pending:
                fut.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for stream in streams:
                await stream.aclose()

    async def close(self) -> None:
        for c in self.choices:
            await c.close()


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    if index == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + index)
